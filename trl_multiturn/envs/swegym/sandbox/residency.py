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
container's root (`/proc/<its PID 1>/root`, opened once as a descriptor, `ContainerRoot`: every folder and file is
opened relative to it without following a link, so a PID that the container's PID 1 left and a host process took
never stands for the container), so the later container finds every page of its own resident whatever
the first one did, and every block below and every metadata block the walk touched cached. The pages are charged to
the reading process's memory cgroup, not the container's, so the container's own memory pressure does not evict
them, and eviction calls are refused by its seccomp profile. The cost, the image's size in memory while the
container lives (freed with its snapshot) and a read of it per start, is measured in the SWE-Gym README, "The
Docker page cache, how it is closed".
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from .base import SandboxError

READERS = 16  # folders read at once: the reads wait on the disk (or the hypervisor), not on a CPU
# Folders and files are opened without following a link and, like a listing, without updating their access time,
# which would write every inode of the container's snapshot (btrfs copies its metadata then).
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOATIME
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOATIME
_buffers = threading.local()


def _read_whole(folder_fd: int, name: str) -> int:
    """Read the regular file `name` of the folder `folder_fd` to its end; returns the bytes read."""
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = bytearray(1 << 20)
    fd, total = os.open(name, _FILE, dir_fd=folder_fd), 0
    try:
        while count := os.readv(fd, [buffer]):
            total += count
    finally:
        os.close(fd)
    return total


def _open_folder(root_fd: int, parts: tuple[str, ...]) -> int:
    """A descriptor of the folder `parts` below `root_fd`, each step opened relative to the last, no link followed."""
    fd = os.open(".", _FOLDER, dir_fd=root_fd)
    for part in parts:
        try:
            child = os.open(part, _FOLDER, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


def _read_folder(root_fd: int, device: int, parts: tuple[str, ...]) -> tuple[list[tuple[str, ...]], int]:
    """Read every regular file of the folder `parts` below `root_fd` whole; returns its subfolders on `device` (a
    folder of another mount is skipped: a file bound over one of its files, which is read too, is the container's own
    or the engine's) and the bytes read."""
    fd = _open_folder(root_fd, parts)
    try:
        folders, files = [], []
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.stat(follow_symlinks=False).st_dev == device:
                        folders.append((*parts, entry.name))
                elif entry.is_file(follow_symlinks=False):
                    files.append(entry.name)
        return folders, sum(_read_whole(fd, name) for name in files)
    finally:
        os.close(fd)


def make_resident(root_fd: int) -> int:
    """Read every regular file of the file system of the folder `root_fd` whole, through that descriptor only (no
    path from outside it is resolved); returns the bytes read."""
    device, total = os.fstat(root_fd).st_dev, 0
    with ThreadPoolExecutor(READERS) as pool:
        pending = {pool.submit(_read_folder, root_fd, device, ())}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                folders, read = future.result()
                total += read
                pending |= {pool.submit(_read_folder, root_fd, device, parts) for parts in folders}
    return total


class ContainerRoot:
    """The root folder of a container's process, held by descriptor. `/proc/<pid>` is opened once; the process is
    checked to be the container's (its cgroup names it) and its `root` opened through that descriptor, which names
    that process only: once it has ended, nothing more opens through it, whatever process gets its number. `fd`, the
    root's descriptor, holds the container's own root whatever becomes of the process."""

    def __init__(self, proc_fd: int, fd: int):
        self.proc_fd, self.fd = proc_fd, fd

    @classmethod
    def open(cls, pid: int, container_id: str) -> ContainerRoot | None:
        """The root of `pid`, this machine's process of the container `container_id`, where this process may read
        it; else None (a remote engine's process, a process of another container, or not permitted: not root)."""
        if pid <= 0:
            return None
        try:
            proc_fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            with open(os.open("cgroup", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd)) as cgroup:
                if container_id not in cgroup.read():
                    raise PermissionError(f"process {pid} is not of container {container_id}")
            # `root` is a link of /proc's own that leads to the process's root: the one link followed
            return cls(proc_fd, os.open("root", _FOLDER & ~os.O_NOFOLLOW, dir_fd=proc_fd))
        except OSError:
            os.close(proc_fd)
            return None

    def check_running(self) -> None:
        """SandboxError if the container's process has ended (since `open`)."""
        try:
            os.stat("stat", dir_fd=self.proc_fd)
        except OSError as e:
            raise SandboxError(f"the container's process ended ({e.strerror}): the container is gone") from e

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.proc_fd)

    def __enter__(self) -> ContainerRoot:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
