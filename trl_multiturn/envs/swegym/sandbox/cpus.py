"""Dedicated CPUs: each running sandbox holds CPUs of its own that no other sandbox of the machine runs on meanwhile,
so another sandbox's processes never take its CPU time (issue 60; the SWE-Gym README, "Dedicated cores", says what
this narrows of the timing channel between concurrent sandboxes, and what still carries it).

A sandbox takes `sandbox_cpus` CPUs (`SandboxConfig`) when it starts and gives them back when it closes. The claim is
machine-wide, whichever process makes it (trainer ranks, Ray workers, several drivers): one `flock`ed file per CPU
under `LEASES`, held for the sandbox's life (`CpuLease`); the kernel drops a lock with its last descriptor, so the
CPUs of a driver that dies, however it dies, come free at once. Where none are free the sandbox waits for them, at
most `cpu_wait` seconds, before any command runs (a command's and the grading's time limits start after), then gives
up with `SandboxError`: an infrastructure failure, never a result.

The claim is kept by the kernel, not by the sandbox's good will: locally the sandbox's processes run in a cpuset
cgroup of those CPUs (`CpusetCgroup`), which nothing inside can write (no /sys, no capability, mounts refused), and
the kernel confines `sched_setaffinity` to it (a process may narrow its CPUs, never leave them); Docker gives the
container `cpuset_cpus`. Without a cpuset cgroup (not root) the local sandbox's commands start with that affinity,
which they may widen: logged once. Not closed by this (measured: the README): the machine's other processes (the
trainer's, everything in no sandbox), which run on every CPU and which the scheduler moves onto a sandbox's CPU
while another's is busy; the CPUs' shared last-level cache, memory bandwidth and the disk.
"""

from __future__ import annotations

import fcntl
import os
import random
import time
import uuid
import weakref
from pathlib import Path

from .base import SandboxError
from .containment import join_cgroup, remove_orphans

# One lock file per CPU, machine-wide: /dev/shm is this machine's (a tmpfs every process sees, as the /proc views are)
LEASES = Path("/dev/shm/trl_multiturn_cpus")


def machine_cpus() -> list[int]:
    """The CPUs this process may run on, which sandboxes are handed from."""
    return sorted(os.sched_getaffinity(0))


class CpuLease:
    """An exclusive, machine-wide claim on `count` CPUs for the life of a sandbox: an flock on one file per CPU
    under `folder`, which the kernel drops if this process dies. Waits up to `wait` seconds for them to come free,
    then raises SandboxError. A claimant first holds the folder's turnstile (`queue.lock`) until it has its CPUs, so
    a CPU that comes free goes to the claimant already waiting, never to one that comes later (a driver that closes
    a sandbox and at once starts the next would otherwise take its CPU back before a waiter's next poll)."""

    def __init__(self, count: int, wait: float, folder: Path = LEASES):
        cpus = machine_cpus()
        if count > len(cpus):
            raise SandboxError(f"sandbox_cpus={count}: this process may run on {len(cpus)} CPUs ({cpus}); lower it, "
                               "or 0 to share them (no dedicated cores)")
        try:
            folder.mkdir(parents=True)
            os.chmod(folder, 0o1777)  # every user's sandboxes claim here (sticky: none removes another's file)
        except FileExistsError:
            pass
        self._fds: dict[int, int] = {}  # CPU -> its lock file's descriptor
        weakref.finalize(self, _close_all, self._fds)  # a lease lost without release() is released
        turnstile = os.open(folder / "queue.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
        try:
            deadline = time.monotonic() + wait
            _poll(lambda: _lock(turnstile), deadline, wait, count, cpus, folder)
            _poll(lambda: self._claim(cpus, count, folder), deadline, wait, count, cpus, folder)
        finally:
            os.close(turnstile)  # the turnstile's lock goes with it
        self.cpus = tuple(sorted(self._fds))

    def _claim(self, cpus: list[int], count: int, folder: Path) -> bool:
        """Lock `count` of `cpus` without waiting; all or none."""
        offset = random.randrange(len(cpus))
        for cpu in cpus[offset:] + cpus[:offset]:
            fd = os.open(folder / f"cpu{cpu}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
            if not _lock(fd):
                os.close(fd)
                continue
            self._fds[cpu] = fd
            if len(self._fds) == count:
                return True
        self.release()
        return False

    def release(self) -> None:
        _close_all(self._fds)


def _lock(fd: int) -> bool:
    """An exclusive flock on `fd` without waiting: True if taken."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _poll(attempt, deadline: float, wait: float, count: int, cpus: list[int], folder: Path) -> None:
    """Call `attempt()` until it returns True, pausing between tries (50 ms, doubling to 1 s, jittered); past
    `deadline`, SandboxError."""
    pause = 0.05
    while not attempt():
        if time.monotonic() >= deadline:
            raise SandboxError(f"no {count} CPU(s) of {cpus} came free in {wait:g} s (cpu_wait): other sandboxes "
                               f"hold them (locks under {folder}); run fewer sandboxes at once, or set "
                               "sandbox_cpus=0 to share the CPUs")
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)) * random.uniform(0.5, 1.5))
        pause = min(pause * 2, 1.0)


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()


CPUSET_ROOT = Path("/sys/fs/cgroup")
GROUP = "trl_multiturn_sandboxes"


class CpusetCgroup:
    """A cpuset cgroup of `cpus` that a local sandbox's processes run in: cgroup v1's cpuset hierarchy (a group of
    its own) or v2 (the sandbox's memory cgroup, `containment.MemoryCgroup`, with its cpuset controller on: a v2
    process is in one group only)."""

    def __init__(self, path: Path, own: bool):
        self.path, self.own = path, own

    @classmethod
    def create(cls, cpus: tuple[int, ...], v2_group: Path | None) -> CpusetCgroup:
        """The cgroup, or OSError where none can be made (not root, no cpuset controller)."""
        text = ",".join(map(str, cpus))
        controllers = CPUSET_ROOT / "cgroup.controllers"
        if controllers.exists():  # v2: the memory cgroup's own group
            if v2_group is None or "cpuset" not in controllers.read_text().split():
                raise OSError("no cpuset controller, or no sandbox cgroup to enable it in")
            for level in (CPUSET_ROOT, v2_group.parent):
                (level / "cgroup.subtree_control").write_text("+cpuset")
            (v2_group / "cpuset.cpus").write_text(text)
            return cls(v2_group, own=False)
        hierarchy = CPUSET_ROOT / "cpuset"
        if not (hierarchy / "cpuset.cpus").exists():
            raise OSError("no cpuset cgroup controller under /sys/fs/cgroup")
        parent = hierarchy / GROUP
        parent.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):  # v1: a group takes CPUs and memory nodes from its parent's
            if not (parent / name).read_text().strip():
                (parent / name).write_text((hierarchy / name).read_text())
        remove_orphans(parent)
        path = parent / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        try:
            (path / "cpuset.mems").write_text((parent / "cpuset.mems").read_text())
            (path / "cpuset.cpus").write_text(text)
        except OSError:
            path.rmdir()
            raise
        return cls(path, own=True)

    def enter(self) -> None:
        """Move the calling process into the group (in the child before exec); nothing to do for v2's shared group,
        which the memory cgroup's `enter` joins."""
        if self.own:
            join_cgroup(self.path)

    def remove(self) -> None:
        if self.own:
            try:
                self.path.rmdir()
            except OSError:
                pass  # a process not yet reaped still holds it; the next sandbox removes it (`remove_orphans`)
