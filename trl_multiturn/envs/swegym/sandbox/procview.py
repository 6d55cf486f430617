"""What a sandbox reads of the machine's memory statistics and activity counters: a fixed view, the same in every
sandbox.

/proc/meminfo, /proc/vmstat and their kin are the machine's, not the sandbox's: one sandbox that allocates or
frees memory (or fills the page cache, or makes dentries) moves them for every other, a channel between concurrent
sandboxes (issue 60). So do the machine's activity counters: /proc/stat's CPU times, forks, context switches,
interrupts and running processes, /proc/loadavg, the disk, interrupt and scheduler counters (bits carried, measured:
the SWE-Gym README's attack table, "CPU and disk activity counters"). `/proc/meminfo` says the sandbox's own memory
limit, all of it free; `/proc/stat` every CPU idle and nothing counted, with the machine's boot time (which `ps` and
psutil add start times to) and a line per CPU (which the C library counts where /sys is hidden); `/proc/loadavg`
nothing running; `/proc/uptime` a fixed time up and no idle time; the files of `EMPTIED` and the folders of
`EMPTIED_DIRS` and `PTY_DIRS` (the machine's pty count) are empty; the `sysinfo` call, which reports memory and load
(the C library's `getloadavg`, Python's `os.getloadavg`, asks it), is refused (`seccomp.py`).

`/proc/uptime` is fixed since each sandbox runs on CPUs of its own (`cpus.py`): its second field, the machine's idle
time summed over every CPU, moves with the other sandboxes' load, which their own CPUs keep off a sandbox's own
timing (as far as they do: the SWE-Gym README, "Dedicated cores"). Its
first field (CLOCK_BOOTTIME, which `clock_gettime` gives any process: nothing of the others) then stands still:
`ps`'s ELAPSED and %CPU, which subtract a process's start from it, read as if the machine had been up 10^9 s (always
positive, never advancing), and `uptime` and `top` say so; a start time (`ps`'s STARTED, psutil's `create_time`) adds
to `/proc/stat`'s `btime` and stays right. A view that advances and says nothing of the others would need a file
system that serves it (lxcfs, as LXC and Incus do: a FUSE daemon every sandbox reads through, root and /dev/fuse on
every machine, its own response time shared by all sandboxes; and lxcfs's uptime is the container's age, which
breaks ELAPSED the same way), for two columns of `ps`: not worth it.

Both backends hide them by mounts, not by names: a view is mounted over the machine's file (locally bubblewrap binds
this module's files; Docker binds the views of `FIXED`, which runc lets it bind over /proc, and masks the rest through
the engine's masked paths, a `/dev/null` over each file and an empty read-only tmpfs over each folder), so every way to
the same file (`/proc/self/../vmstat`, `openat` on a /proc descriptor, `/proc/thread-self/..`) ends at the mount. No
process in a
sandbox can take a mount away (no capability; the mount calls refused by seccomp). `/sys` is an allow-list: the
local sandbox has none, and Docker masks every entry of it but `SYS_SHOWN` (the container's own cgroup; the lists
of CPUs the C library counts), so the per-node meminfo/vmstat, `/sys/kernel/mm`, `/sys/kernel/slab` and any counter a
later kernel adds there are hidden too. Why not Landlock: its rules attach to inodes that exist when the rule is
made, so it cannot allow `/proc/<pid>` of a later process without allowing all of /proc (every `/proc/self` read
would fail), and in Docker the wrapper that applies it would run from files the container's root may rewrite for the
next command (the SWE-Gym README, "Isolation between runs").
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

# The files a sandbox sees empty: per-zone and per-order counts, slab caches, swap use, the dentry, inode, file and
# AIO counts, the machine's file locks (/proc/locks lists every lock of every process, the sandboxes' own files'
# included), and its disk, interrupt and scheduler counters.
EMPTIED = ("/proc/vmstat", "/proc/zoneinfo", "/proc/buddyinfo", "/proc/pagetypeinfo", "/proc/slabinfo",
           "/proc/swaps", "/proc/locks", "/proc/sys/fs/dentry-state", "/proc/sys/fs/inode-nr",
           "/proc/sys/fs/inode-state", "/proc/sys/fs/file-nr", "/proc/sys/fs/aio-nr", "/proc/diskstats",
           "/proc/interrupts", "/proc/softirqs", "/proc/schedstat")
EMPTIED_DIRS = ("/proc/pressure",)  # reclaim and stall times (memory, io, cpu, irq: whatever this kernel has)
# Pseudo-terminals: the machine's count of open ptys (`nr`) beside its limits, moved by every sandbox that opens one
# (each has a devpts instance of its own, the count is the kernel's); seen as an empty folder like `EMPTIED_DIRS`.
PTY_DIRS = ("/proc/sys/kernel/pty",)
MEMINFO, STAT, LOADAVG, UPTIME = "/proc/meminfo", "/proc/stat", "/proc/loadavg", "/proc/uptime"
FIXED = (MEMINFO, STAT, LOADAVG, UPTIME)  # the files a view of fixed text replaces
# What Docker shows of /sys (the local sandbox shows none); everything beside these is masked: the container's cgroup,
# and the CPUs online, possible and present, which the C library counts (`os.cpu_count`), not the CPUs' own folders
# (their idle times, frequencies and cache statistics move with every sandbox's load)
SYS_SHOWN = ("/sys/fs/cgroup", "/sys/devices/system/cpu/online", "/sys/devices/system/cpu/possible",
             "/sys/devices/system/cpu/present")
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


def stat_text(machine: str) -> str:
    """/proc/stat as a sandbox sees it, from the machine's (`machine`, its text): a line per CPU (and their sum)
    with no time counted, no interrupt, context switch or fork, one process running, the machine's `btime`."""
    lines = machine.splitlines()
    cpus = [line.split()[0] for line in lines if line.startswith("cpu")]
    btime = next(line for line in lines if line.startswith("btime "))
    return "".join(f"{cpu:<4}{' 0' * 10}\n" for cpu in cpus) + (
        f"intr 0\nctxt 0\n{btime}\nprocesses 0\nprocs_running 1\nprocs_blocked 0\nsoftirq 0\n")


LOADAVG_TEXT = "0.00 0.00 0.00 1/1 1\n"  # no load; one process running of one; the last pid given, 1
# up 10^9 s (past every process's start, so `ps`'s ELAPSED, uptime less start, stays positive), never idle (as the
# /proc/stat view's CPUs: no time counted)
UPTIME_TEXT = "1000000000.00 0.00\n"


def write_views(folder: Path, megabytes: int) -> dict[str, Path]:
    """Write the view into `folder` (made, world-readable; a file already there is replaced whole, never changed
    in place; a file's name says its text, so a changed text is a new file); returns {path inside the sandbox: file
    or empty folder in `folder`}, for the paths this machine's /proc has (a bind needs its target to exist)."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    stat = stat_text(Path(STAT).read_text())
    texts = {MEMINFO: meminfo_text(megabytes), STAT: stat, LOADAVG: LOADAVG_TEXT, UPTIME: UPTIME_TEXT}
    names = {path: f"{Path(path).name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
             for path, text in texts.items()}
    files = {**{names[path]: text for path, text in texts.items()}, "empty": ""}
    for name, text in files.items():
        if not (folder / name).exists():
            with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as f:
                f.write(text)
            os.chmod(f.name, 0o444)
            os.replace(f.name, folder / name)
    (folder / "empty.d").mkdir(mode=0o555, exist_ok=True)
    views = {path: folder / name for path, name in names.items()}
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
    /sys beside `SYS_SHOWN` (the views of `FIXED` are bound instead)."""
    return [*EMPTIED, *EMPTIED_DIRS, *PTY_DIRS, *sys_hidden()]
