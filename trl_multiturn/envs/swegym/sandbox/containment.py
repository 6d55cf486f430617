"""Limits on a local sandbox as a whole, beyond the per-process rlimits: a disk quota for its writable folders (a
size-limited tmpfs mounted on the host folder that holds them) and a memory limit for all its processes together
(a cgroup). Both need root and a kernel that offers them; where one is missing the sandbox says so once, in the log,
and keeps the per-process limits only (see the SWE-Gym README's containment section)."""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from pathlib import Path

logger = logging.getLogger(__name__)
_warned: set[str] = set()
CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "trl_multiturn_sandboxes"


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def mount_quota(folder: Path, megabytes: int) -> bool:
    """Mount a tmpfs of `megabytes` MiB on `folder` (an empty folder), so that what is written below it can never
    take more than that (ENOSPC) and never reaches the host disk. True when mounted."""
    if os.geteuid() != 0:
        warn_once("quota", "sandbox disk quota: not root, so the sandbox folders are not size-limited (only each "
                  "file is, by max_file_mb); see the SWE-Gym README, 'Containment'")
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0711", "trl-multiturn-sandbox",
                           str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        warn_once("quota", f"sandbox disk quota: could not mount a tmpfs ({done.stderr.strip()}), so the sandbox "
                  "folders are not size-limited; see the SWE-Gym README, 'Containment'")
        return False
    return True


def unmount(folder: Path) -> None:
    """Detach the quota tmpfs (its files go with it), even while a process still has a file of it open."""
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _memory_hierarchy() -> tuple[Path, str] | None:
    """The folder of the memory cgroup hierarchy and its limit file: cgroup v2 (memory.max) or v1 (memory)."""
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return CGROUP_ROOT, "memory.max"
    if (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists():
        return CGROUP_ROOT / "memory", "memory.limit_in_bytes"
    return None


class MemoryCgroup:
    """A cgroup of its own whose memory limit holds for all the processes of one sandbox together (tmpfs pages
    they write count too); the kernel's OOM killer ends a process of that cgroup that goes past it."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, megabytes: int) -> MemoryCgroup | None:
        """A fresh cgroup limited to `megabytes` MiB, or None (logged once) where none can be made."""
        hierarchy = _memory_hierarchy()
        try:
            if hierarchy is None:
                raise OSError("no memory cgroup controller under /sys/fs/cgroup")
            root, limit_file = hierarchy
            parent = root / GROUP
            parent.mkdir(exist_ok=True)
            if limit_file == "memory.max":  # v2: the controller must be enabled for the children of each level
                for level in (root, parent):
                    (level / "cgroup.subtree_control").write_text("+memory")
            path = parent / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
            path.mkdir()
            (path / limit_file).write_text(str(megabytes * 1024 * 1024))
            return cls(path)
        except OSError as e:
            warn_once("cgroup", f"sandbox memory limit: no cgroup could be made ({e}); each process keeps its own "
                      "limits (memory_mb, max_processes) but their total is not bounded; see the SWE-Gym README, "
                      "'Containment'")
            return None

    def enter(self) -> None:
        """Move the calling process into the cgroup; run in the child before exec, so everything it starts is in."""
        fd = os.open(self.path / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Remove the cgroup (empty once its commands have ended)."""
        try:
            self.path.rmdir()
        except OSError:
            pass  # a process not yet reaped still holds it; an empty leftover folder costs nothing
