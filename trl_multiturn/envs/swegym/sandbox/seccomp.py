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

Why hand-written BPF rather than libseccomp: the filter is one list and thirty lines of code with no system package
or compiled binding to install (libseccomp's Python binding is Debian's python3-seccomp, not importable from a
virtual environment), and the test suite checks every listed call against the kernel.
"""

from __future__ import annotations

import errno
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
}
CLONE, CLONE3, PERSONALITY = (56, 220), (435, 435), (135, 92)
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET, as Docker's profile masks clone's flags
CLONE_NAMESPACES = 0x7E020000
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # Docker's: Linux, with and without the fixed ADDR_*
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column of the tables, AUDIT_ARCH_*
X32_BIT = 0x40000000

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_KILL_PROCESS, _ALLOW, _ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg 0: its low 32 bits, little-endian)


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _deny(nr: int, err: int = errno.EPERM) -> bytes:
    """If the call is `nr`, return `err`; else go on."""
    return _op(_JEQ, nr, 0, 1) + _op(_RET, _ERRNO | err)


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one's) as bytes of `struct sock_filter`, the form `--seccomp`
    reads."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise SandboxError(f"no seccomp filter for {machine}: the local sandbox supports {sorted(ARCHES)}; use "
                           "sandbox='docker' (Docker's own profile)")
    column, audit_arch = ARCHES[machine]
    prog = _op(_LD_W_ABS, _ARCH) + _op(_JEQ, audit_arch, 1, 0) + _op(_RET, _KILL_PROCESS) + _op(_LD_W_ABS, _NR)
    if machine == "x86_64":
        prog += _op(_JGE, X32_BIT, 0, 1) + _op(_RET, _ERRNO | errno.ENOSYS)
    for numbers in DENIED.values():
        if numbers[column] is not None:
            prog += _deny(numbers[column])
    prog += _deny(CLONE3[column], errno.ENOSYS)
    # clone with a namespace flag: EPERM; other clones allowed (the instructions after ld jump over each other)
    prog += _op(_JEQ, CLONE[column], 0, 4) + _op(_LD_W_ABS, _ARG0) + _op(_JSET, CLONE_NAMESPACES, 0, 1)
    prog += _op(_RET, _ERRNO | errno.EPERM) + _op(_RET, _ALLOW)
    allowed = len(PERSONALITIES)
    prog += _op(_JEQ, PERSONALITY[column], 0, allowed + 3) + _op(_LD_W_ABS, _ARG0)
    for i, value in enumerate(PERSONALITIES):
        prog += _op(_JEQ, value, allowed - i, 0)
    prog += _op(_RET, _ERRNO | errno.EPERM) + _op(_RET, _ALLOW)
    return prog + _op(_RET, _ALLOW)
