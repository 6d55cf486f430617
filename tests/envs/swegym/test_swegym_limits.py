"""The local sandbox as a whole is bounded: its writable folders by a disk quota (a tmpfs of `disk_mb`), all its
processes together by a memory cgroup (`total_memory_mb`). Both need root and a kernel offering them; the tests
skip, saying why, where the machine has neither."""

from __future__ import annotations

import dataclasses
import os

import pytest

from trl_multiturn.envs.swegym import LocalSandbox, SandboxConfig, task_rows
from trl_multiturn.envs.swegym.sandbox.containment import _memory_hierarchy

ROWS = {row["repo"].split("/")[1]: row for row in task_rows()}
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def config(swegym_cache_dir):
    return SandboxConfig(repo_cache_dir=swegym_cache_dir, command_timeout=120, max_processes=48)


@pytest.mark.skipif(not AS_ROOT, reason="the quota tmpfs is mounted as root only; not root, there is no quota")
@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_writing_past_the_disk_quota_fails_and_stays_off_the_host_disk(config, isolation):
    with LocalSandbox(dataclasses.replace(config, disk_mb=64, max_file_mb=32, isolation=isolation)) as sandbox:
        sandbox.start(ROWS["roman"])
        folder = sandbox.host_workdir.parent
        disk = os.statvfs(folder)
        assert disk.f_blocks * disk.f_frsize == 64 * 1024 * 1024  # the sandbox's own 64 MiB filesystem
        fill = sandbox.run("for i in 1 2 3; do head -c 30M /dev/zero > $TMPDIR/big$i || exit 7; done; echo filled")
        assert fill.exit_code == 7 and "No space left on device" in fill.output and "filled" not in fill.output
        checkout = sandbox.run("head -c 30M /dev/zero > more.bin; echo $?")
        assert "No space left on device" in checkout.output
        freed = sandbox.run("rm -f $TMPDIR/big* more.bin && echo hello > notes.txt && cat notes.txt")
        assert freed.output == "hello\n"
    assert not folder.exists()  # unmounted and removed


@pytest.mark.skipif(not AS_ROOT or _memory_hierarchy() is None,
                    reason="needs root and a memory cgroup controller under /sys/fs/cgroup (v1 or v2)")
def test_the_sandbox_total_memory_is_bounded_by_a_cgroup(config):
    """600 MiB in a child process: within its own limit (memory_mb), past the sandbox's total."""
    script = "python -c \"data = b'x' * (600 << 20); print('held')\"; echo exit $?"
    limited = dataclasses.replace(config, memory_mb=1024, total_memory_mb=300)
    with LocalSandbox(limited) as sandbox:
        sandbox.start(ROWS["roman"])
        cgroup = sandbox._cgroup.path
        result = sandbox.run(script)
        assert "held" not in result.output.splitlines() and "exit 137" in result.output, result.output  # OOM-killed
    assert not cgroup.exists()
    with LocalSandbox(dataclasses.replace(limited, total_memory_mb=2048)) as sandbox:  # the same, with room
        sandbox.start(ROWS["roman"])
        assert sandbox.run(script).output == "held\nexit 0\n"
