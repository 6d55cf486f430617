"""What a sandbox reads of the machine's memory statistics: a fixed view, the same in every sandbox.

/proc/meminfo, /proc/vmstat and their kin are the machine's, not the sandbox's: one sandbox that allocates or
frees memory (or fills the page cache) moves them for every other, a channel between concurrent sandboxes (issue
60). Both backends put a file of this module's over each: `/proc/meminfo` says the sandbox's own memory limit, all
of it free; the others are empty. The `sysinfo` call, which reports the same, is refused (`seccomp.py`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# The files a sandbox sees empty: per-zone and per-order counts, slab caches, reclaim and pressure statistics, and
# the machine's file locks (/proc/locks lists every lock of every process, the sandboxes' own files' included).
EMPTIED = ("/proc/vmstat", "/proc/zoneinfo", "/proc/buddyinfo", "/proc/pagetypeinfo", "/proc/slabinfo",
           "/proc/pressure/memory", "/proc/pressure/io", "/proc/pressure/cpu", "/proc/locks")
MEMINFO = "/proc/meminfo"
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
    in place); returns {path inside the sandbox: file in `folder`}, for the paths this machine's /proc has (a bind
    needs its target to exist)."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    files = {f"meminfo-{megabytes}": meminfo_text(megabytes), "empty": ""}
    for name, text in files.items():
        if not (folder / name).exists():
            with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as f:
                f.write(text)
            os.chmod(f.name, 0o444)
            os.replace(f.name, folder / name)
    views = {MEMINFO: folder / f"meminfo-{megabytes}"}
    views.update({path: folder / "empty" for path in EMPTIED if Path(path).exists()})
    return views
