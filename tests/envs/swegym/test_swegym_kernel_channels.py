"""State the kernel keeps on files every sandbox shares, or about the whole machine, carries nothing from one sandbox
to a later or a concurrent one, on both backends. Each test runs an attacker's probe (`kernel_probe.py`)
in one sandbox to set 16 random bits and in another to read them back, one channel class at a time; the bits read
must match no better than chance (at most 14 of 16: a chance match of 15 or more has odds of 17 in 65,536), or the
readers must be refused outright.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from docker_engine import docker_client
from kernel_probe import command, evict_on_host, matching, readers

from trl_multiturn.envs.swegym import SandboxConfig, make_sandbox, task_rows
from trl_multiturn.envs.swegym.sandbox.base import SandboxError
from trl_multiturn.envs.swegym.sandbox.containment import MAX_PTYS
from trl_multiturn.envs.swegym.sandbox.procview import (
    EMPTIED,
    EMPTIED_DIRS,
    LOADAVG,
    LOADAVG_TEXT,
    PTY_DIRS,
    STAT,
    SYS_SHOWN,
    UPTIME,
    UPTIME_TEXT,
    meminfo_text,
    stat_text,
)
from trl_multiturn.envs.swegym.sandbox.residency import ContainerRoot, make_resident

ROW = next(row for row in task_rows() if row["repo"].endswith("/roman"))
CHANCE = 14  # the most bits of 16 a reader may recover


@pytest.fixture(scope="module", params=["local", "docker"])
def config(request, swegym_cache_dir):
    if request.param == "docker":
        docker_client()
    return SandboxConfig(sandbox=request.param, repo_cache_dir=swegym_cache_dir, command_timeout=300,
                         max_processes=64)


@pytest.fixture(scope="module")
def pair(config):
    """Two sandboxes of the same task running at the same time."""
    sandboxes = [make_sandbox(config), make_sandbox(config)]
    try:
        for sandbox in sandboxes:
            sandbox.start(ROW)
        yield sandboxes
    finally:
        for sandbox in sandboxes:
            sandbox.close()


@pytest.fixture
def salt_and_bits():
    return random.randrange(1 << 30), "".join(random.choice("01") for _ in range(16))


def _run(sandbox, *args, **run_args) -> str:
    result = sandbox.run(command(*args), timeout=300, **run_args)
    assert result.exit_code == 0, result.output
    return result.output


def _while_running(sandbox, args: tuple, then, **run_args) -> str:
    """Run the probe with `args` (and `run_args` for `run`) in `sandbox` in a thread, call `then()` once it wrote its
    `ready` file, tell it to stop, and return its output."""
    sandbox.run("rm -f /tmp/swegym/ready /tmp/swegym/stop")
    out = {}
    thread = threading.Thread(target=lambda: out.update(text=_run(sandbox, *args, **run_args)))
    thread.start()
    try:
        deadline = time.monotonic() + 600  # tells a probe that never got ready from a slow one
        while sandbox.read_scratch("ready") is None and thread.is_alive():
            assert time.monotonic() < deadline, "the probe never got ready"
            time.sleep(0.05)
        if thread.is_alive():  # else the probe had nothing to wait for (its calls refused): its output says so
            then()
    finally:
        sandbox.write_scratch("stop", "")
        thread.join()
    return out["text"]


def _at_chance(bits: str, found: dict[str, str], names: list[str]) -> None:
    assert set(names) <= set(found), found
    for name in names:
        assert matching(bits, found[name]) <= CHANCE, (name, bits, found[name])


def test_page_cache_residency_cannot_be_set_or_read_directly(config, salt_and_bits):
    """Between consecutive sandboxes: the first sets the residency of shared files' pages (evicting with
    posix_fadvise, loading by reading), the second reads it with preadv's RWF_NOWAIT (no page in the cache: EAGAIN).
    Eviction and the no-wait read are refused (allowed, they carry 16 of 16 bits locally)."""
    salt, bits = salt_and_bits
    with make_sandbox(config) as first:
        first.start(ROW)
        assert _run(first, "write", "pagecache", salt, bits).split() == ["written", "fadvise:EPERM"]
    # madvise's WILLNEED/PAGEOUT/COLD refused, DONTNEED allowed (mincore, cachestat, readahead: the seccomp list test)
    script = ("import mmap, os\nf = open('/usr/bin/env', 'rb')\nm = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)"
              "\nout = []\nfor advice in (3, 21, 20, 4):  # WILLNEED, PAGEOUT, COLD, DONTNEED\n"
              "    try:\n        m.madvise(advice); out.append('ok')\n"
              "    except OSError as e:\n        out.append(e.errno)\nprint(*out)")
    with make_sandbox(config) as second:
        second.start(ROW)
        found = readers(_run(second, "read", "pagecache", salt))
        result = second.run(f"python - <<'EOF'\n{script}\nEOF")
    assert found["nowait"] == "?" * 16  # refused (ENOSYS locally; Docker's overlayfs never had it: EOPNOTSUPP)
    assert result.output.split() == ["1", "1", "1", "ok"], result.output  # DONTNEED drops only the mapping


def _carried_by_reading(config, salt: int, bits: str) -> dict[str, str]:
    """A first sandbox reads the pages of its 1 bits (files both see, picked at random: reading cannot be
    refused); a second times its reads and counts its major faults touching them. Returns what each reader of the
    second found. The host's files the probe picks are dropped from the cache first: a file some other program read
    would be cached whatever the first sandbox did."""
    evict_on_host(salt)
    with make_sandbox(config) as first:
        first.start(ROW)
        _run(first, "write", "pagecache", salt, bits)
    with make_sandbox(config) as second:
        second.start(ROW)
        return readers(_run(second, "read", "pagecache", salt))


def test_page_cache_residency_set_by_reading_carries_nothing(config, salt_and_bits):
    """Between consecutive sandboxes, each with files of its own, so a page one read is not cached for the next one's
    file, which is another inode. Local: each sandbox runs on a private copy of a minimal root (`rootfs.py`), every
    page of it resident from the copy; before, the host's /usr was one set of inodes for every sandbox and this
    carried 15-16 of 16 bits. Docker, on an engine whose storage driver gives each container files of its own
    (btrfs snapshots: see tests/docker_engine.py; on overlay2, the image's files shared, this carried 16 of 16): the
    snapshots share the image's blocks, which a cache below the kernel keeps (a virtual machine's disk cache), so
    every page of the second sandbox's files is made resident before its first command (`residency.py`): the fault
    counter finds its files' first pages resident (before: 0-2 of 16, its files' pages never read), so no read of
    it reaches that cache, and timing its reads finds them all cached alike. One miss is allowed: once in about
    seven runs (a fresh-clone CI of wave 10) the first file read was slow by both readers, '0111111111111111', a
    cause not found (a first-touch cost of the reader, or a page not resident); main misses 14-16."""
    salt, bits = salt_and_bits
    found = _carried_by_reading(config, salt, bits)
    for name in ("faults", "timing"):
        assert matching(bits, found[name]) <= CHANCE, (name, bits, found[name])
    if config.sandbox == "docker":
        assert found["faults"].count("1") >= 15, found


def test_only_the_containers_own_process_is_read_through():
    """The Docker sandbox reads a container's files through `/proc/<PID 1>/root` only where that process is the
    container's (its cgroup names it): never a process of this machine that a remote engine's PID happens to name."""
    assert ContainerRoot.open(os.getpid(), "0" * 64) is None
    assert ContainerRoot.open(0, "0" * 64) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="a process with a root of its own needs chroot (root)")
def test_the_residency_walk_reads_only_through_the_roots_descriptor(tmp_path):
    """The walk opens the container's root once, as a descriptor, and every folder and file relative to it without
    following a link: it reads exactly that root's regular files (not a link's target outside it), even after the
    process has ended, when `/proc/<pid>/root` by path names nothing or, its number reused, another process's root;
    and a process ended under the walk is a SandboxError (before: each file reopened by path below
    `/proc/<pid>/root`). A chrooted child of this test stands for the container's PID 1, its cgroup for the id."""
    tree = tmp_path / "root"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "top").write_bytes(b"x" * 10)
    (tree / "a" / "b" / "deep").write_bytes(b"y" * 100_000)
    (tmp_path / "outside").write_bytes(b"z" * 7)
    (tree / "a" / "out").symlink_to(tmp_path / "outside")
    (tree / "a" / "up").symlink_to(tmp_path)
    script = "import os, sys, time\nos.chroot(sys.argv[1])\nprint(1, flush=True)\ntime.sleep(300)"
    child = subprocess.Popen([sys.executable, "-c", script, str(tree)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"1\n"
        root = ContainerRoot.open(child.pid, Path(f"/proc/{child.pid}/cgroup").read_text())
        assert root is not None
        with root:
            assert make_resident(root.fd) == 100_010
            root.check_running()
            child.kill()
            child.wait()
            assert not Path(f"/proc/{child.pid}/root").exists()
            assert make_resident(root.fd) == 100_010  # still the container's root, through the descriptor
            with pytest.raises(SandboxError, match="container is gone"):
                root.check_running()
    finally:
        child.kill()
        child.wait()


def test_file_locks_on_shared_files_carry_nothing(pair, salt_and_bits):
    """Between concurrent sandboxes: one holds flocks (exclusive) or POSIX read locks on shared read-only files for
    its 1 bits; the other tries a non-blocking flock, asks F_GETLK who would stop a write lock, and reads
    /proc/locks (which lists only its own PID namespace's locks). flock and F_GETLK are refused (allowed, each
    carries 16 of 16 bits)."""
    first, second = pair
    salt, bits = salt_and_bits
    found = {}
    for channel in ("flock", "lockf"):
        wrote = _while_running(first, ("write", channel, salt, bits, 600),
                               lambda: found.update(readers(_run(second, "read", channel, salt))))
        assert wrote.startswith("written")
    _at_chance(bits, found, ["flock", "lockf", "proc_locks"])
    assert found["flock"] == found["lockf"] == "?" * 16  # refused


@pytest.mark.parametrize("config", ["local"], indirect=True)  # ignore_flock is the local sandbox's seccomp filter's
def test_flock_ignored_for_an_agent_program_carries_nothing(config, pair, salt_and_bits):
    """`run(..., ignore_flock=True)` (Codex CLI's command, which gives up when flock fails): flock succeeds without
    taking a lock, so a writer holding flocks for its 1 bits leaves nothing for a reader (ignoring flock too) to
    find: every one of its non-blocking flocks succeeds."""
    first, second = pair
    salt, bits = salt_and_bits
    found = {}
    wrote = _while_running(first, ("write", "flock", salt, bits, 600),
                           lambda: found.update(readers(_run(second, "read", "flock", salt, ignore_flock=True))),
                           ignore_flock=True)
    assert wrote.startswith("written")
    assert found["flock"] == "0" * 16


def test_inotify_on_shared_files_carries_nothing(pair, salt_and_bits):
    """Between concurrent sandboxes: one watches 16 shared files with inotify, the other opens those of its 1
    bits. inotify is refused (allowed, it carries 16 of 16 bits)."""
    first, second = pair
    salt, bits = salt_and_bits
    watched = _while_running(second, ("read", "inotify", salt, 600),
                             lambda: _run(first, "write", "inotify", salt, bits))
    found = readers(watched)
    _at_chance(bits, found, ["inotify"])
    assert found["inotify"] == "?" * 16  # inotify_init1 refused


SPACE_MB = 128  # what a writer writes into each place it may write


def _free_space(sandbox) -> dict[str, int]:
    """{mount point: free bytes} of every file system `sandbox` sees (statvfs)."""
    return {line.split()[1]: int(line.split()[2]) for line in _run(sandbox, "read", "space").splitlines()
            if line.startswith("space ") and line.split()[2].isdigit()}


def _write_space(sandbox) -> None:
    """Write SPACE_MB MiB into every place of `sandbox` that takes it (the repository at least: the case occurs)."""
    out = _run(sandbox, "write", "space", SPACE_MB).split()
    took = dict(word.rsplit("=", 1) for word in out[1:])
    assert out[0] == "written" and took["."] == str(SPACE_MB), out


def _fallen(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The file systems whose free space fell by half of what the writer wrote into one place, or more: MiB fallen."""
    return {point: (before[point] - after[point]) >> 20 for point in before
            if point in after and before[point] - after[point] >= SPACE_MB << 19}


def test_free_space_carries_nothing_between_concurrent_sandboxes(pair):
    """One sandbox writes SPACE_MB MiB into every place it may write and keeps it; the other's statvfs of every file
    system it sees does not move by half of that. Docker: the container's root is read-only and every place it may
    write a tmpfs of its own (before: `statvfs("/")` was the engine's btrfs, shared by every container, and fell by
    what the other wrote)."""
    first, second = pair
    before = _free_space(second)
    try:
        _write_space(first)
        assert _fallen(before, _free_space(second)) == {}
    finally:
        _run(first, "clear", "space")


def test_free_space_carries_nothing_to_a_later_sandbox(config, pair):
    """A sandbox writes SPACE_MB MiB into every place it may write and is closed; the free space of every file system
    a running sandbox sees (what a later one would see: the same file systems) is not lower by half of that. Docker:
    nothing a container writes is on the engine's file system (before: a removed container's blocks came back only
    when `btrfs-cleaner` reached its snapshot, a bit per grading for the next one)."""
    reader = pair[1]
    before = _free_space(reader)
    with make_sandbox(config) as writer:
        writer.start(ROW)
        _write_space(writer)
    assert _fallen(before, _free_space(reader)) == {}


HOG = ("import os, time\nchunk = bytearray(256 << 20)\nfor i in range(0, len(chunk), 4096):\n    chunk[i] = 1\n"
       "open('/dev/shm/hog', 'wb').write(b'x' * (32 << 20))\n"
       "for i in range(20000):\n    os.path.exists(f'/tmp/swegym/absent-{os.getpid()}-{i}')\n"
       "open('/tmp/swegym/ready', 'w').close()\n"
       "while not os.path.exists('/tmp/swegym/stop'):\n    time.sleep(0.05)\n")


def test_memory_statistics_carry_nothing(pair, config):
    """Between concurrent sandboxes: the one reads /proc/meminfo, sysinfo, /proc/vmstat, node 0's meminfo under /sys
    and the dentry count while the other holds 256 MiB of memory and 32 MiB of shared memory (and has looked up
    20,000 absent names), and after; the values are the sandbox's own fixed view, unmoved, or nothing, never the
    machine's (before: Docker's vmstat and node 0, and both backends' dentry count, moved with the other's)."""
    first, second = pair
    idle = _run(second, "read", "meminfo")
    busy = {}
    first.run("rm -f /tmp/swegym/ready /tmp/swegym/stop")
    thread = threading.Thread(target=lambda: first.run(f"python - <<'EOF'\n{HOG}\nEOF", timeout=600))
    thread.start()
    try:
        while first.read_scratch("ready") is None and thread.is_alive():
            time.sleep(0.05)
        busy["text"] = _run(second, "read", "meminfo")
    finally:
        first.write_scratch("stop", "")
        thread.join()
    megabytes = config.total_memory_mb if config.sandbox == "local" else config.memory_mb
    view = dict(line.split(":") for line in meminfo_text(megabytes).splitlines())
    expected = [f"{key} {view[key].split()[0]}" for key in ("Shmem", "MemFree", "MemAvailable")]
    expected += ["vmstat ?", "node0 ?", "dentries ?"]
    kept = [line for line in idle.splitlines() if not line.startswith("sysinfo")]
    assert kept == [line for line in busy["text"].splitlines() if not line.startswith("sysinfo")] == expected


def test_machine_memory_statistics_are_hidden_by_every_route(pair, config):
    """Each hidden /proc file and folder (`procview.EMPTIED`, `EMPTIED_DIRS`, `PTY_DIRS`) reads empty or is refused by
    its path, through /proc/self/.., through /proc/thread-self/.. and by `openat` on a /proc descriptor (the hiding is
    a mount, not a name; /proc/cpuinfo, not hidden, reads by all four); no file of the machine's memory statistics
    under /sys reads (per-node meminfo and vmstat, /sys/kernel/mm, the slab caches), nor do the CPUs' idle times and
    the disks' counters; /sys shows nothing beside `procview.SYS_SHOWN`, and the memory cgroup it shows is the
    container's own (its limit is the sandbox's). The machine's activity counters likewise: /proc/stat and
    /proc/loadavg read as their fixed views by every route (nothing counted, nothing running), the disk, interrupt and
    scheduler counters empty, and /proc/uptime a fixed time up with no idle time (before: the machine's idle time over
    every CPU, which moves with the other sandboxes' load once each runs on CPUs of its own). Before, in Docker:
    vmstat, zoneinfo, buddyinfo, pressure and the node files read the machine's numbers; locally: the dentry, inode and
    file counts; on both, the machine's pty count (`kernel/pty/nr`); and /proc/stat's fork count carried 48 of 48 bits
    between concurrent sandboxes locally, 45 in Docker (the SWE-Gym README, "CPU and disk activity counters")."""
    fixed = {STAT: stat_text(open(STAT).read()), LOADAVG: LOADAVG_TEXT, UPTIME: UPTIME_TEXT}
    emptied = (*EMPTIED, *EMPTIED_DIRS, *PTY_DIRS)
    out = _run(pair[0], "read", "machine", ":".join(SYS_SHOWN), "/proc/cpuinfo", *emptied, *fixed)
    proc = [line.split() for line in out.splitlines() if line.startswith("proc ")]
    hidden = 4 * (1 + len(emptied))
    assert len(proc) == hidden + 4 * len(fixed)
    assert all(line[3] not in ("0", "refused") for line in proc[:4]), out
    assert [line for line in proc[4:hidden] if line[3] not in ("0", "refused")] == [], out
    assert [(path, int(size)) for _, _, path, size in proc[hidden:]] == [
        (path, len(text)) for path, text in fixed.items() for _ in range(4)], out
    assert [line for line in out.splitlines() if line.startswith(("sys_readable", "sys_visible"))] == [], out
    assert pair[0].run(f"cat {UPTIME}").output == UPTIME_TEXT
    if config.sandbox == "docker":  # the local sandbox has no /sys
        limits = [line.split()[1] for line in out.splitlines() if line.startswith("cgroup_limit")]
        assert limits == [str(config.memory_mb << 20)], out


def test_a_sandbox_holds_no_more_ptys_than_its_own_cap(pair):
    """A sandbox opens ptys until refused: it gets `containment.MAX_PTYS` (its own devpts instance), never the
    machine's pool, so concurrent sandboxes can still open theirs (before: 3,071 locally, the machine's whole pool;
    Docker's devpts had no cap either)."""
    script = ("import os\nfds = []\ntry:\n    while len(fds) < 10000:\n"
              "        fds.append(os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY))\nexcept OSError as e:\n"
              "    print(len(fds), e.strerror)\n")
    first, second = pair
    first.write_scratch("ptys.py", script)
    assert first.run(f"python {first.scratch_dir}/ptys.py").output == f"{MAX_PTYS} No space left on device\n"
    assert second.run("python -c 'import pty; pty.openpty(); print(1)'").output == "1\n"


PIN = ("import os, subprocess, sys\nprint(sorted(os.sched_getaffinity(0)))\nos.sched_setaffinity(0, range(1024))\n"
       "print(sorted(os.sched_getaffinity(0)))\n"
       "print(subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'], "
       "capture_output=True, text=True).stdout.strip())\n"
       "try:\n    os.sched_setaffinity(0, {int(sys.argv[1])})\n    print(sorted(os.sched_getaffinity(0)))\n"
       "except OSError as e:\n    print('refused', e.strerror)\n")


@pytest.fixture
def pinned_pair(config):
    """Two sandboxes running at once with one CPU of its own each (`sandbox_cpus`, off by default), closed after
    the test: they hold two of this machine's CPUs, which any other pinned sandbox would wait for."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two sandboxes with a CPU of its own each need two CPUs")
    with make_sandbox(dataclasses.replace(config, sandbox_cpus=1)) as first, \
            make_sandbox(dataclasses.replace(config, sandbox_cpus=1)) as second:
        first.start(ROW)
        second.start(ROW)
        yield first, second


def test_concurrent_sandboxes_run_on_cpus_of_their_own(pinned_pair):
    """Two sandboxes running at once hold disjoint CPUs (`sandbox_cpus`, one each here), and every process of each
    runs on its own CPUs only: a command asks for every CPU (sched_setaffinity) and still gets its own, a child it
    starts too, and asking for the other sandbox's CPU alone is refused (locally the kernel confines the affinity to
    the sandbox's cpuset cgroup, in Docker to the container's cpuset): the other's processes never take its CPU time
    (before: both ran on every CPU; the SWE-Gym README, "Dedicated cores", measures what timing still carries)."""
    first, second = pinned_pair
    assert first.cpus is not None and second.cpus is not None
    assert len(first.cpus) == len(second.cpus) == 1 and not set(first.cpus) & set(second.cpus)
    for sandbox, other in ((first, second), (second, first)):
        sandbox.write_scratch("pin.py", PIN)
        result = sandbox.run(f"python {sandbox.scratch_dir}/pin.py {other.cpus[0]}")
        own = str(list(sandbox.cpus))
        assert result.output.splitlines() == [own, own, own, "refused Invalid argument"], result.output
