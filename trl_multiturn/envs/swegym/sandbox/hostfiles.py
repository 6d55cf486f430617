"""Host-side reads and writes of files the agent controls, which can never block or leave the sandbox's folders.

The agent can put anything where the trainer will look: a FIFO (an `open` that waits for a writer forever), a
device (`/dev/zero`: a read without end), a symbolic link to a host file. Every open here is `O_NOFOLLOW` (a link
is refused) and `O_NONBLOCK` (opening a FIFO returns at once), then `fstat` must say a regular file, and reads are
cut at a size limit. `dir_fd` opens relative to a folder already opened the same way, so no link in the path is
followed either.
"""

from __future__ import annotations

import errno
import os
import stat

from .base import SandboxPathError


def open_regular(path: str, flags: int, *, dir_fd: int | None = None, shown: str | None = None) -> int:
    """A descriptor of the regular file `path` opened with `flags`; `SandboxPathError` for anything else."""
    shown = shown or path
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise SandboxPathError(f"{shown}: no such file") from None
        if e.errno == errno.ELOOP:
            raise SandboxPathError(f"{shown}: a symbolic link; give the file it points to") from None
        raise SandboxPathError(f"{shown}: not a regular file ({os.strerror(e.errno)})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SandboxPathError(f"{shown}: not a regular file (a folder, FIFO, socket or device)")
    return fd


def read_regular(path: str, limit: int, *, dir_fd: int | None = None, shown: str | None = None) -> bytes:
    """The bytes of the regular file `path`, refused when longer than `limit`."""
    with os.fdopen(open_regular(path, os.O_RDONLY, dir_fd=dir_fd, shown=shown), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise SandboxPathError(f"{shown or path}: larger than {limit} bytes")
    return data


def write_regular(path: str, data: bytes, *, dir_fd: int | None = None, exclusive: bool = False,
                  owner: int | None = None, mode: int | None = None) -> None:
    """Write `data` as the whole content of the regular file `path` (made if missing; `exclusive`: it must be).
    `owner` and `mode` are set on the open file, before anything is written."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else 0)
    with os.fdopen(open_regular(path, flags, dir_fd=dir_fd), "wb") as f:
        if owner is not None:
            os.fchown(f.fileno(), owner, owner)
        if mode is not None:
            os.fchmod(f.fileno(), mode)
        f.truncate(0)
        f.write(data)


def open_folder(path: str, *, dir_fd: int | None = None) -> int:
    """A descriptor of the real folder `path` (not a link to one), for `dir_fd`; `SandboxPathError` otherwise."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        raise SandboxPathError(f"{path}: not a folder ({os.strerror(e.errno)})") from None
