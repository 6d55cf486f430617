"""What a sandbox reads of the machine's memory statistics: a fixed view, the same in every sandbox.

/proc/meminfo, /proc/vmstat and their kin are the machine's, not the sandbox's: one sandbox that allocates or
frees memory (or fills the page cache, or makes dentries) moves them for every other, a channel between concurrent
sandboxes (issue 60). `/proc/meminfo` says the sandbox's own memory limit, all of it free; the files of `EMPTIED`
and the folders of `EMPTIED_DIRS` and `PTY_DIRS` (the machine's pty count) are empty; the `sysinfo` call, which
reports the same, is refused (`seccomp.py`).

Both backends hide them by mounts, not by names: a view is mounted over the machine's file (locally bubblewrap binds
this module's files; Docker binds the meminfo view and masks the rest through the engine's masked paths, a
`/dev/null` over each file and an empty read-only tmpfs over each folder), so every way to the same file
(`/proc/self/../vmstat`, `openat` on a /proc descriptor, `/proc/thread-self/..`) ends at the mount. No process in a
sandbox can take a mount away (no capability; the mount calls refused by seccomp). `/sys` is an allow-list: the
local sandbox has none, and Docker masks every entry of it but `SYS_SHOWN` (the container's own cgroup; the CPUs,
which the C library counts), so the per-node meminfo/vmstat, `/sys/kernel/mm`, `/sys/kernel/slab` and any counter a
later kernel adds there are hidden too. Why not Landlock: its rules attach to inodes that exist when the rule is
made, so it cannot allow `/proc/<pid>` of a later process without allowing all of /proc (every `/proc/self` read
would fail), and in Docker the wrapper that applies it would run from files the container's root may rewrite for the
next command (the SWE-Gym README, "Isolation between runs").
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# The files a sandbox sees empty: per-zone and per-order counts, slab caches, swap use, the dentry, inode, file and
# AIO counts, and the machine's file locks (/proc/locks lists every lock of every process, the sandboxes' own
# files' included).
EMPTIED = ("/proc/vmstat", "/proc/zoneinfo", "/proc/buddyinfo", "/proc/pagetypeinfo", "/proc/slabinfo",
           "/proc/swaps", "/proc/locks", "/proc/sys/fs/dentry-state", "/proc/sys/fs/inode-nr",
           "/proc/sys/fs/inode-state", "/proc/sys/fs/file-nr", "/proc/sys/fs/aio-nr")
EMPTIED_DIRS = ("/proc/pressure",)  # reclaim and stall times (memory, io, cpu, irq: whatever this kernel has)
# Pseudo-terminals: the machine's count of open ptys (`nr`) beside its limits, moved by every sandbox that opens one
# (each has a devpts instance of its own, the count is the kernel's); seen as an empty folder like `EMPTIED_DIRS`.
PTY_DIRS = ("/proc/sys/kernel/pty",)
MEMINFO = "/proc/meminfo"
# What Docker shows of /sys (the local sandbox shows none); everything beside these is masked
SYS_SHOWN = ("/sys/fs/cgroup", "/sys/devices/system/cpu")
# Where the Docker sandbox keeps the view files it binds (the engine must see them: it runs on this machine): files of
# fixed text on a tmpfs, so always in memory (their page cache says nothing), shared by every container and kept.
SHARED = Path("/dev/shm/trl_multiturn_proc_views")


def meminfo_text(megabytes: int) -> str:
    """/proc/meminfo as a sandbox limited to `megabytes` MiB sees it: that much in all, all of it free, no swap."""
    kb = megabytes * 1024
    fields = {"MemTotal": kb, "MemFree": kb, "MemAvailable": kb, "Buffers": 0, "Cached": 0, "SwapCached": 0,
              "Active": 0, "Inactive": 0, "SwapTotal": 0, "SwapFree": 0, "Dirty": 0, "Writeback": 0,
              "AnonPages": 0, "Mapped": 0, "Shmem": 0}
    return "".join(f"{key + ':':<16}{value:>8} kB\n" for key, value in fields.items())


def write_views(folder: Path, megabytes: int) -> dict[str, Path]:
    """Write the view into `folder` (made, world-readable; a file already there is replaced whole, never changed
    in place); returns {path inside the sandbox: file or empty folder in `folder`}, for the paths this machine's
    /proc has (a bind needs its target to exist)."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    files = {f"meminfo-{megabytes}": meminfo_text(megabytes), "empty": ""}
    for name, text in files.items():
        if not (folder / name).exists():
            with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as f:
                f.write(text)
            os.chmod(f.name, 0o444)
            os.replace(f.name, folder / name)
    (folder / "empty.d").mkdir(mode=0o555, exist_ok=True)
    views = {MEMINFO: folder / f"meminfo-{megabytes}"}
    views.update({path: folder / "empty" for path in EMPTIED if Path(path).exists()})
    views.update({path: folder / "empty.d" for path in (*EMPTIED_DIRS, *PTY_DIRS) if Path(path).is_dir()})
    return views


def sys_hidden(top: str = "/sys", shown: tuple[str, ...] = SYS_SHOWN) -> list[str]:
    """Every entry of this machine's `top` that is neither one of `shown`, inside one, nor a folder on the way to
    one: what Docker masks so that a container sees of `top` only `shown` (and the folders leading there)."""
    hidden = []
    for entry in sorted(os.scandir(top), key=lambda e: e.name):
        if entry.path in shown:
            continue
        if entry.is_dir(follow_symlinks=False) and any(path.startswith(entry.path + "/") for path in shown):
            hidden += sys_hidden(entry.path, shown)
        else:
            hidden.append(entry.path)
    return hidden


def masked_paths() -> list[str]:
    """What the Docker sandbox masks beside the engine's own masked paths: `EMPTIED`, `EMPTIED_DIRS`, `PTY_DIRS` and
    /sys beside `SYS_SHOWN` (the meminfo view is bound instead)."""
    return [*EMPTIED, *EMPTIED_DIRS, *PTY_DIRS, *sys_hidden()]
