"""Dedicated CPUs (`sandbox/cpus.py`): a machine-wide claim on CPUs, one flock'ed file per CPU. Claims never overlap
whichever process makes them, a claim that finds none free waits, then fails as an infrastructure failure, and a
killed driver's CPUs come free. Each test claims under a folder of its own, so sandboxes running on the machine
meanwhile change nothing (the sandboxes' own pinning: `test_concurrent_sandboxes_run_on_cpus_of_their_own`)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import trl_multiturn
from trl_multiturn.envs.swegym import SandboxConfig
from trl_multiturn.envs.swegym.sandbox.base import SandboxError
from trl_multiturn.envs.swegym.sandbox.cpus import CpuLease, machine_cpus

HOLD = ("import sys; from pathlib import Path; from trl_multiturn.envs.swegym.sandbox.cpus import CpuLease\n"
        "lease = CpuLease(int(sys.argv[1]), 5, Path(sys.argv[2])); print(*lease.cpus, flush=True); sys.stdin.read()")


def test_claims_are_disjoint_and_released(tmp_path):
    cpus = machine_cpus()
    leases = [CpuLease(1, 1, tmp_path) for _ in cpus]
    assert sorted(c for lease in leases for c in lease.cpus) == cpus  # every CPU once
    with pytest.raises(SandboxError, match="cpu_wait"):
        CpuLease(1, 0.1, tmp_path)
    leases[0].release()
    again = CpuLease(1, 0.1, tmp_path)
    assert again.cpus == leases[0].cpus  # a released CPU, the only one free
    del again
    assert CpuLease(1, 0.1, tmp_path).cpus == leases[0].cpus  # a lease lost without release() released it


def test_a_freed_cpu_goes_to_the_claimant_already_waiting(tmp_path):
    """Every CPU held; a claimant waits (holding the turnstile); one CPU is released and claimed at once by a later
    claimant, as a driver that closes a sandbox and starts the next does: the later one gets nothing, the waiting
    one gets the CPU (without the turnstile the later one took it, and the waiter could starve)."""
    held = [CpuLease(1, 1, tmp_path) for _ in machine_cpus()]
    got = {}
    waiter = threading.Thread(target=lambda: got.update(lease=CpuLease(1, 120, tmp_path)))
    waiter.start()
    turnstile = os.open(tmp_path / "queue.lock", os.O_RDONLY | os.O_CREAT)
    try:
        deadline = time.monotonic() + 120  # tells "never" from "slow"
        while True:  # until the waiter holds the turnstile
            assert time.monotonic() < deadline and waiter.is_alive(), "the waiter never held the turnstile"
            try:
                fcntl.flock(turnstile, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            except BlockingIOError:
                break
        held[0].release()
        with pytest.raises(SandboxError, match="came free"):
            CpuLease(1, 0.1, tmp_path)
    finally:
        os.close(turnstile)
        waiter.join()
    assert got["lease"].cpus == held[0].cpus


def test_a_killed_drivers_cpus_come_free(tmp_path):
    """A driver in another process holds every CPU, so a claim here waits and fails; SIGKILL to it frees them."""
    cpus = machine_cpus()
    path = {**os.environ, "PYTHONPATH": str(Path(trl_multiturn.__file__).parents[1])}  # this tree's package
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(len(cpus)), str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=path)
    try:
        assert [int(c) for c in holder.stdout.readline().split()] == cpus
        with pytest.raises(SandboxError, match="came free"):
            CpuLease(1, 0.1, tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert CpuLease(len(cpus), 0.1, tmp_path).cpus == tuple(cpus)


def test_cpu_settings_are_checked_when_the_config_is_built():
    usable = len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=rf"sandbox_cpus={usable + 1}: .* give at most {usable}, or 0"):
        SandboxConfig(sandbox_cpus=usable + 1)
    with pytest.raises(ValueError, match=r"docker_cpus=2: .* give docker_cpus <= 1"):
        SandboxConfig(sandbox="docker", sandbox_cpus=1, docker_cpus=2.0)
    assert SandboxConfig(sandbox="docker", sandbox_cpus=0, docker_cpus=2.0).sandbox_cpus == 0  # shared: any quota
