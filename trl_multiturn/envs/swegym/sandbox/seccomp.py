"""The seccomp filter of every local sandbox command: a classic BPF program, written here, that bubblewrap loads
(`--seccomp FD`) before it runs the command.

It denies, with EPERM, at least what Docker's default profile denies to a container without capabilities: the
kernel keyring (`add_key`, `request_key`, `keyctl`: keys outlive the sandbox and are shared by every process of a
user namespace), other processes' memory (`ptrace`, `process_vm_*`, `kcmp`, `pidfd_getfd`), `bpf`,
`perf_event_open`, `userfaultfd`, every mount call (the old and the new mount API), new or other namespaces
(`unshare`, `setns`, `clone` with a namespace flag, `clone3` as ENOSYS so that the C library falls back to `clone`),
`io_uring_*` (its operations bypass this filter), module, kexec, swap, reboot, clock, quota, accounting and syslog
calls, file handles (`open_by_handle_at`), NUMA placement, `fanotify_init`, `personality` except the values Docker
allows; on x86_64 the x32 system calls (ENOSYS) and the legacy `iopl`/`ioperm`/`uselib`/`_sysctl`/... calls. A
program of another architecture (a 32-bit binary) is killed.

Beyond Docker's profile it closes the state the kernel keeps on files that every sandbox shares (the host's /usr,
an image's lower layer), which one sandbox could set and a later or concurrent one read (issue 60): the calls that
read or set a shared file's page-cache residency (`mincore`, `cachestat`, `fadvise64`, `readahead`,
`process_madvise`, `madvise` with an advice that reads pages in or pushes them out, `preadv2`/`pwritev2` as ENOSYS
so that the C library falls back to `preadv`/`pwritev`, which have no RWF_NOWAIT), file locks that another
sandbox's process could see on the same inode (`flock`; `fcntl`'s F_GETLK and F_OFD_GETLK, the only way to see a
read lock through a read-only descriptor; F_NOTIFY), `inotify_*` (watches on shared files see other sandboxes'
opens) and `sysinfo` (the machine's free memory and process count). What stays open is in the SWE-Gym README's
attack table: a page a sandbox reads stays cached, and a later one can tell by its fault count or its timing.

Why hand-written BPF rather than libseccomp: the filter is one list and thirty lines of code with no system package
or compiled binding to install (libseccomp's Python binding is Debian's python3-seccomp, not importable from a
virtual environment), and the test suite checks every listed call against the kernel.
"""

from __future__ import annotations

import errno
import json
import platform
import struct

from .base import SandboxError

# name: (x86_64, aarch64); None where the architecture has no such call
DENIED: dict[str, tuple[int | None, int | None]] = {
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438), "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "unshare": (272, 97), "setns": (308, 268),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "create_module": (174, None), "get_kernel_syms": (177, None),
    "query_module": (178, None), "acct": (163, 89), "quotactl": (179, 60), "quotactl_fd": (443, 443),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "settimeofday": (164, 170),
    "clock_settime": (227, 112), "adjtimex": (159, 171), "clock_adjtime": (305, 266), "syslog": (103, 116),
    "lookup_dcookie": (212, 18), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "iopl": (172, None), "ioperm": (173, None), "uselib": (134, None), "_sysctl": (156, None), "sysfs": (139, None),
    "ustat": (136, None), "nfsservctl": (180, 42), "vhangup": (153, 58), "fanotify_init": (300, 262),
    "move_pages": (279, 239), "mbind": (237, 235), "set_mempolicy": (238, 237), "get_mempolicy": (239, 236),
    "migrate_pages": (256, 238), "set_mempolicy_home_node": (450, 450),
    # state of shared files and of the machine that outlives a sandbox or reaches a concurrent one (issue 60)
    "mincore": (27, 232), "cachestat": (451, 451), "fadvise64": (221, 223), "readahead": (187, 213),
    "process_madvise": (440, 440), "flock": (73, 32), "inotify_init": (253, None), "inotify_init1": (294, 26),
    "inotify_add_watch": (254, 27), "sysinfo": (99, 179),
}
# ENOSYS rather than EPERM, so that the C library falls back to an older call (clone, preadv, pwritev)
NOT_IMPLEMENTED: dict[str, tuple[int, int]] = {"clone3": (435, 435), "preadv2": (327, 286), "pwritev2": (328, 287)}
# EPERM for these values of one argument (its index): madvise's advice, fcntl's command
MADV_WILLNEED, MADV_COLD, MADV_PAGEOUT, MADV_POPULATE_READ, MADV_POPULATE_WRITE = 3, 20, 21, 22, 23
F_GETLK, F_OFD_GETLK, F_NOTIFY = 5, 36, 1026
ARGUMENT_DENIED: dict[str, tuple[tuple[int, int], int, tuple[int, ...]]] = {
    "madvise": ((28, 233), 2, (MADV_WILLNEED, MADV_COLD, MADV_PAGEOUT, MADV_POPULATE_READ, MADV_POPULATE_WRITE)),
    "fcntl": ((72, 25), 1, (F_GETLK, F_OFD_GETLK, F_NOTIFY)),
}
CLONE, CLONE3, PERSONALITY = (56, 220), NOT_IMPLEMENTED["clone3"], (135, 92)
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET, as Docker's profile masks clone's flags
CLONE_NAMESPACES = 0x7E020000
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # Docker's: Linux, with and without the fixed ADDR_*
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column of the tables, AUDIT_ARCH_*
X32_BIT = 0x40000000

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_KILL_PROCESS, _ALLOW, _ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg i: its low 32 bits at 16 + 8 i, little-endian)


def docker_profile(machine: str | None = None) -> str:
    """The same filter as a Docker seccomp profile (JSON, for `security_opt=["seccomp=..."]`): everything allowed
    but the calls above, so that both backends refuse the same calls. Not expressed: `personality`'s allowed values
    (a profile's rule cannot say "none of these"); the container has no capability that would make another value
    matter."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise SandboxError(f"no seccomp profile for {machine}: supported {sorted(ARCHES)}")
    column = ARCHES[machine][0]

    def rule(names, err, args=()):
        return {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": err, "args": list(args)}

    names = [name for name, numbers in DENIED.items() if numbers[column] is not None]
    rules = [rule(names, errno.EPERM), rule(sorted(NOT_IMPLEMENTED), errno.ENOSYS)]
    for name, (_, arg, values) in ARGUMENT_DENIED.items():
        rules += [rule([name], errno.EPERM, [{"index": arg, "value": v, "op": "SCMP_CMP_EQ"}]) for v in values]
    flags = [1 << bit for bit in range(32) if CLONE_NAMESPACES >> bit & 1]
    rules += [rule(["clone"], errno.EPERM, [{"index": 0, "value": f, "valueTwo": f, "op": "SCMP_CMP_MASKED_EQ"}])
              for f in flags]
    arch = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}[machine]
    return json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arch], "syscalls": rules})


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _deny(nr: int, err: int = errno.EPERM) -> bytes:
    """If the call is `nr`, return `err`; else go on."""
    return _op(_JEQ, nr, 0, 1) + _op(_RET, _ERRNO | err)


def seccomp_program(machine: str | None = None, *, ignore_flock: bool = False) -> bytes:
    """The filter for `machine` (default: this one's) as bytes of `struct sock_filter`, the form `--seccomp`
    reads. `ignore_flock`: `flock` returns 0 without taking a lock instead of failing with EPERM, for a program that
    gives up when it cannot lock its own files (Codex CLI, `agents/codex_cli.py`); no lock is taken either way, so
    no other sandbox can see one."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise SandboxError(f"no seccomp filter for {machine}: the local sandbox supports {sorted(ARCHES)}; use "
                           "sandbox='docker' (Docker's own profile)")
    column, audit_arch = ARCHES[machine]
    prog = _op(_LD_W_ABS, _ARCH) + _op(_JEQ, audit_arch, 1, 0) + _op(_RET, _KILL_PROCESS) + _op(_LD_W_ABS, _NR)
    if machine == "x86_64":
        prog += _op(_JGE, X32_BIT, 0, 1) + _op(_RET, _ERRNO | errno.ENOSYS)
    for name, numbers in DENIED.items():
        if numbers[column] is not None:
            prog += _deny(numbers[column], 0 if ignore_flock and name == "flock" else errno.EPERM)
    for numbers in NOT_IMPLEMENTED.values():
        prog += _deny(numbers[column], errno.ENOSYS)
    # a call with a denied argument value: EPERM; with another, allowed (after ld, the accumulator holds the
    # argument, so each such block ends in a return)
    for numbers, arg, values in ARGUMENT_DENIED.values():
        prog += _op(_JEQ, numbers[column], 0, len(values) + 3) + _op(_LD_W_ABS, _ARG0 + 8 * arg)
        for i, value in enumerate(values):
            prog += _op(_JEQ, value, len(values) - i, 0)
        prog += _op(_RET, _ALLOW) + _op(_RET, _ERRNO | errno.EPERM)
    # clone with a namespace flag: EPERM; other clones allowed (the instructions after ld jump over each other)
    prog += _op(_JEQ, CLONE[column], 0, 4) + _op(_LD_W_ABS, _ARG0) + _op(_JSET, CLONE_NAMESPACES, 0, 1)
    prog += _op(_RET, _ERRNO | errno.EPERM) + _op(_RET, _ALLOW)
    allowed = len(PERSONALITIES)
    prog += _op(_JEQ, PERSONALITY[column], 0, allowed + 3) + _op(_LD_W_ABS, _ARG0)
    for i, value in enumerate(PERSONALITIES):
        prog += _op(_JEQ, value, allowed - i, 0)
    prog += _op(_RET, _ERRNO | errno.EPERM) + _op(_RET, _ALLOW)
    return prog + _op(_RET, _ALLOW)
