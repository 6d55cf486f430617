"""An infrastructure failure is never a reward, and nothing is left behind, on the local and the Docker backend.

Faults are injected where they happen in practice: a sandbox that does not start (bubblewrap failing, the Docker
engine refusing a container, transiently or for good), a grading run killed from outside (SIGKILL to bubblewrap, a
`docker kill`), the engine failing under a command. Each must raise `SandboxError` out of `grade_patch` and out of
`SWEGymEnv.step` (the rollout's failed-episode path: no reward, the reason in the episode's failure), never grade
the patch. Then a driver process killed (SIGKILL, SIGTERM) while a grading runs leaves no mount, folder or process.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import docker
import psutil
import pytest
import requests
from docker_engine import docker_client

from trl_multiturn.envs.swegym import (
    SandboxConfig,
    SandboxError,
    SWEGymConfig,
    SWEGymEnv,
    grade_patch,
    make_sandbox,
    task_rows,
)
from trl_multiturn.envs.swegym.patches import make_patch
from trl_multiturn.envs.swegym.sandbox import bwrap
from trl_multiturn.envs.swegym.sandbox import docker as docker_backend
from trl_multiturn.envs.swegym.sandbox.containment import (
    CHILD_SETUP_FAILED,
    GROUP,
    MOUNT_POINT,
    MemoryCgroup,
    _memory_hierarchy,
    reporting_child,
)
from trl_multiturn.envs.swegym.sandbox.orphans import DRIVER_LABEL, driver_gone, driver_identity
from trl_multiturn.envs.swegym.tasks import task_sources

ROWS = {row["repo"].split("/")[1]: row for row in task_rows()}
SOURCES = {source.name: source for source in task_sources()}
LABEL = "trl_multiturn.swegym"


def _hanging_patch() -> str:
    """wordfreq with a module that sleeps at import: its test run waits until something kills it."""
    module = SOURCES["wordfreq"].files_at_base()["wordfreq/tokenize.py"]
    return make_patch({"wordfreq/tokenize.py": module},
                      {"wordfreq/tokenize.py": "import time\ntime.sleep(3000)\n" + module})


@pytest.fixture(params=["local", "docker"])
def config(request, swegym_cache_dir):
    if request.param == "docker":
        docker_client()
    return SWEGymConfig(sandbox=request.param, repo_cache_dir=swegym_cache_dir, command_timeout=60,
                        max_processes=64, eval_timeout=3000)


def _wait_for(condition, what: str, deadline_s: float = 600):
    """Poll `condition` until it returns something true (the deadline only tells "never" from "slow")."""
    deadline = time.monotonic() + deadline_s
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what}")
        time.sleep(0.05)
    return found


def _eval_bwrap(root: psutil.Process) -> psutil.Process | None:
    """The bubblewrap process (a descendant of `root`) that runs grading's test script."""
    for proc in root.children(recursive=True):
        try:
            if proc.name() == "bwrap" and any("eval.sh" in arg for arg in proc.cmdline()) and (
                    proc.parent().name() != "bwrap"):
                return proc
        except psutil.Error:
            continue
    return None


def _containers(client, driver: str) -> list:
    """The containers of the driver whose identity (`orphans.driver_identity`) is `driver`."""
    return client.containers.list(all=True, sparse=True, filters={"label": f"{DRIVER_LABEL}={driver}"})


def _eval_container(client, driver: str):
    """A sandbox container of the driver `driver` whose test script is running."""
    for container in _containers(client, driver):
        try:
            # `ps -o pid,args`: the whole command line (docker top's default cuts it at 32 characters)
            if "pytest_runner.py" in str(container.top(ps_args="-o pid,args")["Processes"]):
                return container
        except docker.errors.DockerException:
            continue
    return None


# ---------------------------------------------------------------------------------------------------------------
# A sandbox that does not start


@pytest.fixture
def open_folder():
    """A folder every uid may read (bubblewrap starts as the sandbox uid), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="trl-multiturn-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize("config", ["local"], indirect=True)  # bubblewrap is the local backend's
def test_bubblewrap_that_fails_to_start_fails_the_episode(config, monkeypatch, open_folder):
    fake = open_folder / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: injected' >&2\nexit 1\n")
    fake.chmod(0o755)
    row = ROWS["roman"]
    env = SWEGymEnv(config)
    env.reset(row)
    # a command that prints what bubblewrap prints and exits 1 as it does is the agent's, not a failure
    forged = env.step("<bash>echo 'bwrap: Creating new namespace failed' >&2; exit 1</bash>")
    assert "[exit code: 1]" in forged.observation
    for action in env.expert_actions(row)[:-1]:  # the gold fix, made; its submission is graded below
        env.step(action)
    real = bwrap.find_program
    monkeypatch.setattr(bwrap, "find_program",
                        lambda name, *why: str(fake) if name == "bwrap" else real(name, *why))
    with pytest.raises(SandboxError, match="injected"):
        env.step("<submit/>")  # the grading sandbox cannot start: no grade, no reward
    env.close()
    with pytest.raises(SandboxError, match="injected"):
        grade_patch(row, row["patch"], config)


def _api_error(status: int) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code, response.reason, response.url = status, "injected", "http://docker/containers/create"
    return docker.errors.APIError("injected: error writing config to pipe: write init-p: broken pipe", response)


@pytest.mark.parametrize("config", ["docker"], indirect=True)  # the Docker engine is the Docker backend's
def test_container_start_is_retried_on_engine_errors_only(config, monkeypatch):
    monkeypatch.setattr(docker_backend.time, "sleep", lambda seconds: None)
    client = docker_client()
    real_create = docker_backend.DockerSandbox._create
    calls, failed = [], []

    def flaky(failures: int, status: int):
        def create(self, options):
            calls.append(status)
            container = real_create(self, options)
            if len(calls) <= failures:  # the engine made the container, then could not start it
                container.start = lambda: (_ for _ in ()).throw(_api_error(status))
                failed.append(container.id)
            return container
        return create

    row = ROWS["roman"]
    monkeypatch.setattr(docker_backend.DockerSandbox, "_create", flaky(2, 500))
    with make_sandbox(config) as sandbox:
        sandbox.start(row)  # two engine errors, then a container
        assert len(calls) == 3 and sandbox.run("echo up").output == "up\n"
    for failures, status, attempts in [(99, 500, docker_backend.START_ATTEMPTS), (99, 404, 1)]:
        calls.clear()
        monkeypatch.setattr(docker_backend.DockerSandbox, "_create", flaky(failures, status))
        with make_sandbox(config) as sandbox, pytest.raises(SandboxError, match="could not start"):
            sandbox.start(row)
        assert len(calls) == attempts  # a client error (404: no such image) is not tried again
    env = SWEGymEnv(config)
    with pytest.raises(SandboxError, match="could not start"):
        env.reset(row)  # the episode fails at its start
    calls.clear()
    with pytest.raises(SandboxError, match="could not start"):
        grade_patch(row, row["patch"], config)  # the gold patch, but no container: an error, not "not resolved"
    assert calls == [404]
    assert failed and not [c for c in client.containers.list(all=True, filters={"label": LABEL}) if c.id in failed]


# ---------------------------------------------------------------------------------------------------------------
# A grading run killed from outside, an engine failing under a command


def test_grading_killed_from_outside_is_an_error(config):
    row = ROWS["wordfreq"]
    outcome = {}

    def grade():
        try:
            # a run that went on after the kill ends at eval_timeout, and fails below
            outcome["grade"] = grade_patch(row, _hanging_patch(), config, eval_timeout=300)
        except SandboxError as e:
            outcome["error"] = e

    thread = threading.Thread(target=grade)
    thread.start()
    if config.sandbox == "local":
        victim = _wait_for(lambda: _eval_bwrap(psutil.Process()) or not thread.is_alive(), "the test run's bubblewrap")
    else:
        victim = _wait_for(lambda: _eval_container(docker_client(), driver_identity()) or not thread.is_alive(),
                           "the test run's container")
    assert thread.is_alive(), outcome  # grading ended before its test run started: nothing was killed
    victim.kill()  # the machine's OOM killer, an operator
    thread.join()
    assert "grade" not in outcome, outcome["grade"].summary()
    # local: bubblewrap died of a signal we did not send; Docker: the next call finds the container gone (which call
    # depends on when the engine noticed)
    assert re.search("killed from outside" if config.sandbox == "local" else "container", str(outcome["error"]))


@pytest.mark.parametrize("config", ["docker"], indirect=True)  # the Docker engine is the Docker backend's
def test_engine_failing_under_a_command_is_an_error(config, monkeypatch):
    env = SWEGymEnv(config)
    env.reset(ROWS["roman"])
    assert "[exit code: 0]" in env.step("<bash>true</bash>").observation

    def broken(*args, **kwargs):
        raise _api_error(500)

    monkeypatch.setattr(env.sandbox.client.api, "exec_create", broken)
    with pytest.raises(SandboxError, match="could not run the command"):
        env.step("<bash>true</bash>")
    env.sandbox.container.remove(force=True, v=True)  # the container vanishes under the episode
    monkeypatch.undo()
    with pytest.raises(SandboxError):
        env.step("<bash>true</bash>")
    env.close()


# ---------------------------------------------------------------------------------------------------------------
# A driver killed while a grading runs


DRIVER = textwrap.dedent("""
    import sys
    from trl_multiturn.envs.swegym import SWEGymConfig, grade_patch, task_rows
    row = next(r for r in task_rows() if r["repo"].endswith("/wordfreq"))
    config = SWEGymConfig(sandbox=sys.argv[3], repo_cache_dir=sys.argv[1], command_timeout=60, max_processes=64)
    grade_patch(row, open(sys.argv[2]).read(), config, eval_timeout=3000)
""")


def _mounts(*under: Path) -> list[str]:
    """Mount points of the host under any of the folders `under`."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if any(p == str(u) or p.startswith(f"{u}/") for u in under)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_driver_killed_mid_grading_leaves_nothing(config, tmp_path, sig):
    """Local: no mount (the sandbox's tmpfs never was a host mount), no folder, no process; Docker: no container
    (its PID 1 ends with the driver's attached stdin, and the engine removes it) and no volume (its /dev/pts)."""
    patch = tmp_path / "hang.diff"
    patch.write_text(_hanging_patch())
    tmp = tmp_path / "tmp"  # the driver's temporary folder: what it leaves there is its own
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "TMPDIR": str(tmp)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, config.repo_cache_dir, str(patch), config.sandbox],
                              env=env)
    root, sent, identity = psutil.Process(driver.pid), False, driver_identity(driver.pid)
    try:
        if config.sandbox == "local":
            _wait_for(lambda: _eval_bwrap(root), "the driver's test run")
            assert _mounts(tmp, MOUNT_POINT) == []  # during the grading too: the tmpfs is in no host mount table
        else:
            container = _wait_for(lambda: _eval_container(docker_client(), identity), "the driver's test run")
            container.reload()
            volumes = [m["Name"] for m in container.attrs["Mounts"] if m["Type"] == "volume"]
            assert len(volumes) == 1  # its /dev/pts, a devpts instance of its own
        left = root.children(recursive=True)
        assert left or config.sandbox == "docker"  # bubblewrap, its init, bash, pytest... (Docker: none of ours)
        driver.send_signal(sig)
        sent = True
    finally:
        if not sent:
            driver.kill()  # a failed check above must not leave the driver grading
    assert driver.wait() == (-sig if sig == signal.SIGKILL else 128 + sig)
    gone, alive = psutil.wait_procs(left, timeout=120)  # SIGKILL sent by the kernel: only scheduling delays it
    assert alive == []
    assert _mounts(tmp, MOUNT_POINT) == [] and [p.name for p in tmp.iterdir()] in ([], ["trl_multiturn_sandbox_uids"])
    if config.sandbox == "docker":
        _wait_for(lambda: not _containers(docker_client(), identity), "the driver's containers removed")
        assert docker_client().volumes.list(filters={"name": volumes[0]}) == []  # removed with its container


# A driver that stops where it has made a sandbox's container and not started it, then where it would remove the probe
# container `_create` learns the engine's masked paths from (made again: the masks are learnt once per process),
# printing each container's id as it gets there
CREATED_NOT_STARTED = textwrap.dedent("""
    import time
    from trl_multiturn.envs.swegym import DockerSandbox, SWEGymConfig, task_rows
    from trl_multiturn.envs.swegym.sandbox import docker as backend
    row = next(r for r in task_rows() if r["repo"].endswith("/roman"))
    sandbox = DockerSandbox(SWEGymConfig(sandbox="docker"))
    options = {k: v for k, v in sandbox.container_options(row).items() if k != "detach"}
    print(sandbox._create(options).id, flush=True)
    backend._ENGINE_MASKS.clear()
    def held(container, **kwargs):
        print(container, flush=True)
        time.sleep(3600)
    sandbox.client.api.remove_container = held
    sandbox._create(options)
""")


def test_a_driver_identity_names_one_process_of_this_namespace():
    """A driver is gone once its process is (a zombie too: it can start nothing), or its pid names a later process;
    never where it is of another PID namespace or another boot (another machine), whose processes cannot be seen."""
    mine = driver_identity()
    boot, namespace, pid, start = mine.split("/")
    assert pid == str(os.getpid()) and not driver_gone(mine)
    with subprocess.Popen(["sleep", "1000"]) as child:
        theirs = driver_identity(child.pid)
        assert not driver_gone(theirs)
        child.kill()
        _wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, "the child a zombie")
        assert driver_gone(theirs)
    assert driver_gone(theirs) and driver_gone(f"{boot}/{namespace}/{pid}/{int(start) + 1}")  # a pid reused
    assert not any(driver_gone(other) for other in [f"{boot}/pid:[1]/{child.pid}/1", f"other-boot/{namespace}/"
                                                    f"{child.pid}/1", "", "not/an/identity"])


@pytest.mark.parametrize("config", ["docker"], indirect=True)  # the create-start window is the engine's
def test_containers_a_killed_driver_made_and_never_started_are_removed(config):
    """A driver SIGKILLed between a container's create and its start, or between the probe's create and its removal,
    leaves them created (no PID 1 tied to it, as a started sandbox's is): the next sandbox start removes them. A live
    driver's created container (this process's), and one of a driver in another PID namespace, are kept."""
    client = docker_client()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    driver = subprocess.Popen([sys.executable, "-c", CREATED_NOT_STARTED], env=env, stdout=subprocess.PIPE, text=True)
    identity = driver_identity(driver.pid)
    try:
        made, probe = driver.stdout.readline().strip(), driver.stdout.readline().strip()
    finally:
        driver.kill()
        driver.wait()
    live = docker_backend.DockerSandbox(config)
    options = {k: v for k, v in live.container_options(ROWS["roman"]).items() if k != "detach"}
    boot, namespace, pid, start = identity.split("/")
    kept = [live._create(options),  # this process's: alive
            live._create({**options, "labels": {DRIVER_LABEL: f"{boot}/pid:[1]/{pid}/{start}"}})]
    try:
        left = _containers(client, identity)
        assert {c.id for c in left} == {made, probe} and {c.status for c in left} == {"created"}
        volumes = [m["Name"] for m in client.containers.get(made).attrs["Mounts"] if m["Type"] == "volume"]
        assert len(volumes) == 1  # its /dev/pts, made with the container
        with make_sandbox(config) as sandbox:
            sandbox.start(ROWS["roman"])
        assert _containers(client, identity) == []
        assert client.volumes.list(filters={"name": volumes[0]}) == []  # removed with it
        assert [client.containers.get(c.id).status for c in kept] == ["created", "created"]
    finally:
        for container in kept:
            container.remove(force=True, v=True)


@pytest.mark.skipif(os.geteuid() != 0 or _memory_hierarchy() is None, reason="needs root and a memory cgroup")
def test_the_next_sandbox_ends_what_a_dead_driver_left_in_its_cgroup():
    """The backstop for a process that missed its parent-death signal: a cgroup named after a dead process, with a
    process still in it, is emptied and removed when the next sandbox makes its cgroup."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now
    root, limit_file = _memory_hierarchy()
    orphan = root / GROUP / f"{dead.pid}-{os.urandom(6).hex()}"
    orphan.mkdir(parents=True)
    with subprocess.Popen(["sleep", "1000"]) as left:
        (orphan / "cgroup.procs").write_text(str(left.pid))
        made = MemoryCgroup.create(64)
        assert made is not None
        made.remove()
        assert left.wait() == -signal.SIGKILL

    def swept() -> bool:
        MemoryCgroup.create(64).remove()  # each new sandbox's cgroup sweeps (the first one may have met the
        return not orphan.exists()  # process not yet gone)

    _wait_for(swept, "the orphan cgroup removed")


# ---------------------------------------------------------------------------------------------------------------
# A child that cannot be set up, a private space whose descriptor other code closed


@pytest.mark.skipif(os.geteuid() != 0, reason="the private space (a tmpfs in a mount namespace) needs root")
def test_a_sandbox_whose_space_descriptor_was_closed_by_other_code_fails_with_the_reason(swegym_cache_dir):
    """A double close elsewhere in the trainer can close the descriptor of a sandbox's mount namespace, and the
    number can then name another file: the sandbox refuses to run rather than fail in the child or enter another
    namespace, and says why (an infrastructure failure: a SandboxError, never a grade)."""
    config = SWEGymConfig(sandbox="local", repo_cache_dir=swegym_cache_dir)
    with make_sandbox(config) as sandbox:
        sandbox.start(ROWS["roman"])
        space = sandbox._space
        assert space is not None and sandbox.run("echo up").output == "up\n"
        os.close(space.mnt_fd)  # what another object's second close does
        reused = os.open("/dev/null", os.O_RDONLY)
        try:
            assert reused == space.mnt_fd  # the lowest free number: the case where it names another file
            with pytest.raises(SandboxError, match=f"lost its descriptor {space.mnt_fd}"):
                sandbox.run("echo up")
        finally:
            os.close(reused)
            space.mnt_fd = os.open("/dev/null", os.O_RDONLY)  # so that closing the sandbox closes a descriptor of ours


THREAD_AT_FORK = textwrap.dedent("""
    import os, sys, threading
    from trl_multiturn.envs.swegym import SWEGymConfig, make_sandbox, task_rows
    # what OpenTelemetry's batch processors do (loaded with Ray, vLLM...): a thread started in every forked child
    os.register_at_fork(after_in_child=lambda: threading.Thread(target=threading.Event().wait, daemon=True).start())
    row = next(r for r in task_rows() if r["repo"].endswith("/roman"))
    with make_sandbox(SWEGymConfig(sandbox="local", repo_cache_dir=sys.argv[1])) as sandbox:
        sandbox.start(row)
        print(sandbox.run("echo up").output, end="")
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="the private space (a tmpfs in a mount namespace) needs root")
def test_a_library_that_starts_a_thread_in_forked_children_does_not_stop_the_sandbox(swegym_cache_dir):
    """The kernel refuses to move a process that shares its file-system state with another thread into a mount
    namespace (setns: EINVAL), and a `preexec_fn` runs after the at-fork handlers of every library loaded: the
    sandbox enters its space through nsenter, a fresh process, instead (CI's failure in a long test process)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", THREAD_AT_FORK, swegym_cache_dir], env=env, capture_output=True,
                          text=True)
    assert (done.returncode, done.stdout) == (0, "up\n"), done.stderr[-2000:]


def test_a_child_that_cannot_be_set_up_says_why():
    """subprocess reports an exception in a preexec_fn as "Exception occurred in preexec_fn" alone; the sandbox's
    children write the exception where the caller reads it and exit with CHILD_SETUP_FAILED."""
    def setup():
        raise OSError(22, "setns into the sandbox's mount namespace")

    done = subprocess.run(["true"], capture_output=True, text=True, preexec_fn=reporting_child(setup))
    assert done.returncode == CHILD_SETUP_FAILED
    assert "OSError: [Errno 22] setns into the sandbox's mount namespace" in done.stderr


# four processes of 80 MiB each, started one after the other, each holding its memory until all four have allocated
# or died (no clock involved): past a 160 MiB sandbox, while each stays within its own address-space limit (which
# Docker sets to the container's memory)
HOGS = """python - <<'EOF'
import subprocess, sys
hold = "import sys; x = bytearray(80 << 20); print(flush=True); sys.stdin.read()"
hogs = []
for _ in range(4):
    hogs.append(subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    hogs[-1].stdout.readline()  # allocated, or killed
for hog in hogs:
    hog.stdin.close()
print("codes", *sorted(hog.wait() for hog in hogs))
EOF"""


def _small(config: SWEGymConfig) -> SandboxConfig:
    return SandboxConfig(sandbox=config.sandbox, repo_cache_dir=config.repo_cache_dir, total_memory_mb=160,
                         memory_mb=160 if config.sandbox == "docker" else 4096, command_timeout=120)


def test_a_command_past_the_sandbox_memory_limit_is_its_own_doing(config):
    """The kernel's OOM killer, working for the sandbox's own limit (its memory cgroup: memory.events or
    memory.oom_control and memory.failcnt), ends a process of the command: the command's result says so, as the
    code under test's doing (a crash, graded like any), never an infrastructure failure; the sandbox goes on."""
    with make_sandbox(_small(config)) as sandbox:
        sandbox.start(ROWS["roman"])
        result = sandbox.run(HOGS)
        assert result.out_of_memory and result.exit_code == 137, result
        assert "codes -9" in result.output and result.output.endswith("reached its memory limit of 160 MiB]\n")
        assert sandbox.run("echo up").output == "up\n"  # Docker: PID 1 was spared (the command's are picked first)
        assert not sandbox.run("true").out_of_memory


def test_the_machine_out_of_memory_is_an_infrastructure_failure(config, monkeypatch):
    """A process of the sandbox OOM-killed while the machine's OOM killer worked (/proc/vmstat `oom_kill` rose, and
    the sandbox's memory cgroup counted the kill) and the sandbox's own limit was never reached: SandboxError (the
    episode fails, no reward), not a crash of the code. Both counters are fakes here (stand-ins that rise on every
    read: a real machine-wide OOM cannot be caused in a test); the kill is real (SIGKILL). A SIGKILL the code sends
    itself, which no cgroup counts, is its own crash: test_swegym_observe_gaps.py."""
    from trl_multiturn.envs.swegym.sandbox import containment

    with make_sandbox(_small(config)) as sandbox:
        sandbox.start(ROWS["roman"])
        rises, kills = iter(range(10**6)), iter(range(10**6))
        monkeypatch.setattr(containment, "machine_oom_kills", lambda: next(rises))
        assert sandbox.run("echo fine").output == "fine\n"  # nothing killed: the machine's trouble is not ours
        monkeypatch.setattr(containment.MemoryCgroup, "oom_counts", lambda self: (next(kills), 0))
        with pytest.raises(SandboxError, match="machine ran out of memory"):
            sandbox.run("sleep 0.1; kill -9 $$")


@pytest.mark.parametrize("config", ["local"], indirect=True)  # Docker's address-space limit is its memory limit:
def test_a_patch_that_exhausts_its_memory_is_graded_as_failing(config):  # one test process cannot pass it there
    """A patch whose code takes more memory than the grading sandbox has: its test run is killed inside the
    sandbox, and the patch is graded as failing (no reward), with no SandboxError."""
    source = SOURCES["roman"].files_at_base()
    module = next(name for name in source if name.startswith("roman/") and name.endswith(".py")
                  and "test" not in name and name != "roman/__init__.py")
    patch = make_patch({module: source[module]}, {module: "_ballast = bytearray(400 << 20)\n" + source[module]})
    grade = grade_patch(ROWS["roman"], patch, _small(config))
    assert grade.patch_applied and not grade.resolved and grade.reward("dense") == 0.0, grade
