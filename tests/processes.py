"""Process helpers for the tests that check workers and their children are gone (tests/rollout/test_env_pool.py,
test_shutdown.py, tests/trainers/test_faults.py)."""

import os
import select
import time

import psutil


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_exit(pids: list[int], timeout: float = 300.0) -> bool:
    """Wait until every process of `pids` has exited (a zombie counts as exited), on the kernel's exit events (a
    pidfd turns readable when its process exits); `timeout` only stops a broken test from hanging. Whether they
    all exited."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass  # gone already
    try:
        poll = select.poll()
        for fd in fds:
            poll.register(fd, select.POLLIN)
        deadline, left = time.monotonic() + timeout, set(fds)
        while left and time.monotonic() < deadline:
            for fd, _ in poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
                left.discard(fd)
                poll.unregister(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return not any(alive(pid) for pid in pids)
