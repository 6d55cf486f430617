"""Every page of a Docker sandbox's files resident before its first command, so that none of its reads reaches a
cache it shares with other containers.

On the btrfs (or zfs) engine a container's files are a snapshot of its image's: inodes of their own, so a page
one container reads is cached for no other in the kernel's page cache. Their blocks are the image's, though, shared
by every container of every task built on it, and a cache keyed by block below the kernel remembers which were read
(on a virtual machine, the hypervisor's cache of its disk: a block read once comes back several times faster, and a
block just written is cached already); btrfs's metadata, shared by the snapshots, is cached by the kernel itself.
A first container that reads a rarely-read file would leave its blocks cached, and a later one would time its own
first read of it: residency set by reading, which nothing can refuse, carried from one grading to the next.
`DockerSandbox.start` reads each of the container's files whole before it returns, from this machine through the
container's root (`/proc/<its PID 1>/root`), so the later container finds every page of its own resident whatever
the first one did, and every block below and every metadata block the walk touched cached. The pages are charged to
the reading process's memory cgroup, not the container's, so the container's own memory pressure does not evict
them, and eviction calls are refused by its seccomp profile. The cost, the image's size in memory while the
container lives (freed with its snapshot) and a read of it per start, is measured in the SWE-Gym README, "The
Docker page cache, how it is closed".
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

READERS = 16  # files read at once: the reads wait on the disk (or the hypervisor), not on a CPU
_buffers = threading.local()


def _read_whole(path: str) -> None:
    """Read the regular file `path` to its end (a link is not followed)."""
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = bytearray(1 << 20)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOATIME)
    try:
        while os.readv(fd, [buffer]):
            pass
    finally:
        os.close(fd)


def _regular_files(root: str):
    """Paths of the regular files under `root` on its own file system: folders of other mounts are skipped (a file
    bound over one of its files, which is read too, is the container's own or the engine's). Folders are listed,
    like files read, without updating their access time, which would write every inode of the container's snapshot
    (btrfs copies its metadata then)."""
    device, folders = os.stat(root).st_dev, [root]
    while folders:
        folder = folders.pop()
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOATIME)
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    path = os.path.join(folder, entry.name)
                    if entry.is_dir(follow_symlinks=False):
                        if entry.stat(follow_symlinks=False).st_dev == device:
                            folders.append(path)
                    elif entry.is_file(follow_symlinks=False):
                        yield path
        finally:
            os.close(fd)


def make_resident(root: str) -> None:
    """Read every regular file of the file system at `root` whole."""
    with ThreadPoolExecutor(READERS) as pool:
        for _ in pool.map(_read_whole, _regular_files(root)):
            pass


def container_root(pid: int, container_id: str) -> str | None:
    """`/proc/<pid>/root` where `pid` is this machine's process of the container `container_id` (its cgroup names
    it) and this process may read it; else None (a remote engine's process, or not permitted: not root)."""
    root = f"/proc/{pid}/root"
    try:
        if pid <= 0 or container_id not in Path(f"/proc/{pid}/cgroup").read_text():
            return None
        os.listdir(root)
    except OSError:
        return None
    return root
