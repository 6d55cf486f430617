"""DockerSandbox on a real Docker engine (started by the tests if none runs): every shipped task solved end to end
in its container, the limits and the clean-up of containers, and the images built once by their recipe."""

from __future__ import annotations

import time

import pytest
from docker_engine import docker_client, remove_sandbox_containers, sandbox_containers

from trl_multiturn.envs.swegym import DockerSandbox, SandboxPathError, SWEGymConfig, SWEGymEnv, task_rows
from trl_multiturn.envs.swegym.sandbox import images
from trl_multiturn.envs.swegym.sandbox.pyenv import TEST_REQUIREMENTS
from trl_multiturn.envs.swegym.tasks import task_sources

ROWS = {row["repo"].split("/")[1]: row for row in task_rows()}


@pytest.fixture(scope="module")
def client():
    client = docker_client()
    yield client
    # a container whose removal the sandbox began may still be listed (btrfs deletes a subvolume): "removing"
    left = [c.name for c in sandbox_containers(client) if c.status != "removing"]
    remove_sandbox_containers(client)
    assert left == []  # every sandbox removed its container, or the engine is removing it


@pytest.fixture
def config(client):
    return SWEGymConfig(sandbox="docker", command_timeout=3, max_processes=64, memory_mb=1024, max_output_bytes=2000)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_expert_solves_every_task_in_its_container(name, config):
    env = SWEGymEnv(config)
    first = env.reset(ROWS[name])
    assert env.sandbox.image_for(ROWS[name]) == images.task_image_name(next(s for s in task_sources()
                                                                            if s.name == name))
    assert ROWS[name]["problem_statement"].strip()[:40] in first
    assert env.sandbox.run("git rev-parse HEAD").output.strip() == ROWS[name]["base_commit"]
    # a container that cannot start or dies raises SandboxError here (an error of this test, never a grade): what
    # is asserted below is the grade alone
    results = [env.step(action) for action in env.expert_actions(ROWS[name])]
    assert all("[error]" not in r.observation for r in results)
    final = results[-1]
    assert final.done and final.won and final.reward == 1.0 and final.info["grading_problem"] == "", final.observation
    env.close()


def test_commands_are_limited_and_containers_removed(client, config):
    with DockerSandbox(config, client=client) as sandbox:
        sandbox.start(ROWS["roman"])
        container = _check_limits(sandbox)
    assert sandbox.container is None and container.id not in [c.id for c in client.containers.list(all=True)]


def _check_limits(sandbox: DockerSandbox):
    container = sandbox.container
    options = container.attrs["HostConfig"]
    assert options["NetworkMode"] == "none" and options["CapDrop"] == ["ALL"] and options["PidsLimit"] == 64
    assert "no-new-privileges" in options["SecurityOpt"] and options["Memory"] == 1024 * 1024 * 1024
    # the image's files read-only, what the container writes in tmpfs mounts of its own, nothing logged
    assert options["ReadonlyRootfs"] and options["LogConfig"]["Type"] == "none"
    assert set(options["Tmpfs"]) >= {"/testbed", "/tmp", "/root", "/var/tmp"}
    assert "Read-only file system" in sandbox.run("touch /usr/planted").output
    copied = sandbox.run("git rev-parse --is-inside-work-tree && ls -A /root | wc -l").output.split()
    assert copied[0] == "true" and int(copied[1]) > 0, copied  # the image's content of the folders, copied in

    ok = sandbox.run("echo hi; pwd; exit 3")
    assert (ok.exit_code, ok.timed_out, ok.output) == (3, False, "hi\n/testbed\n")
    started = time.monotonic()
    slow = sandbox.run("(setsid sleep 60 >/dev/null 2>&1 &); sleep 900")
    # cut at the 3 s command timeout; the bound only tells "cut" from "waited 900 s", with room for any load
    assert slow.timed_out and slow.exit_code == 124 and time.monotonic() - started < 300
    assert len(sandbox.run("yes | head -c 100000").output) == 2000
    memory = sandbox.run("python -c 'bytearray(3 * 1024 ** 3)'")
    assert "MemoryError" in memory.output
    flood = sandbox.run("python -c \"\nimport os, time\nfor i in range(200):\n    if os.fork() == 0:\n"
                        "        time.sleep(20)\n        os._exit(0)\n\"")
    assert flood.exit_code != 0 and "Resource temporarily unavailable" in flood.output
    assert int(sandbox.run("ls /proc | grep -cE '^[0-9]+$'").output) < 10  # the flood's processes are gone

    sandbox.write_file("roman/new_module.py", "x = 1\n")
    assert sandbox.read_file("/testbed/roman/new_module.py") == "x = 1\n"
    sandbox.write_file("brand/new/folder/a.txt", "made\n")
    assert sandbox.run("cat brand/new/folder/a.txt").output == "made\n"
    with pytest.raises(SandboxPathError, match="outside the repository"):
        sandbox.write_file("../../etc/passwd", "x")
    scratch = sandbox.write_scratch("notes", "written")
    assert sandbox.run(f"echo more >> {scratch}").exit_code == 0
    assert sandbox.read_scratch("notes") == "writtenmore\n"  # through the engine, as grading reads its files
    return container


def test_images_are_built_once_by_recipe(client, monkeypatch):
    base = images.base_image_name()
    assert base.endswith(images.recipe_hash())
    image_id = client.images.get(base).id

    def no_rebuild(client):
        raise AssertionError("the base image was built again although its recipe hash names an existing image")

    monkeypatch.setattr(images, "build_base_image", no_rebuild)
    assert images.ensure_base_image(client) == base  # found by its recipe hash
    assert client.images.get(base).id == image_id
    versions = client.containers.run(base, ["python", "-c", "import pytest, pluggy; print(pytest.__version__, "
                                            "pluggy.__version__)"], network_mode="none", remove=True)
    pins = dict(r.split("==") for r in TEST_REQUIREMENTS)
    assert versions.decode().split() == [pins["pytest"], pins["pluggy"]]  # the local task Python's pins too


def test_writing_past_the_disk_quota_is_refused(client):
    """`disk_mb`, the size of each writable folder's tmpfs (before wave 11: the engine's btrfs quota group,
    `--storage-opt size`): the third 30 MiB file of a 64 MiB repository is refused, and the space is free again once
    the files go."""
    config = SWEGymConfig(sandbox="docker", disk_mb=64, max_file_mb=32, command_timeout=120)
    with DockerSandbox(config) as sandbox:
        sandbox.start(ROWS["roman"])
        fill = sandbox.run("for i in 1 2 3; do head -c 30M /dev/zero > /testbed/big$i || exit 7; done; echo filled")
        assert fill.exit_code == 7 and "No space left on device" in fill.output and "filled" not in fill.output
        freed = sandbox.run("rm -f /testbed/big* && sync && head -c 30M /dev/zero > /tmp/again && echo written")
        assert freed.output == "written\n"


def test_a_container_root_is_no_root_of_the_host(client):
    """The engine remaps the user namespace: the container's uid 0 (its PID 1, and a command's process) is an
    unprivileged uid on the host."""
    with DockerSandbox(SWEGymConfig(sandbox="docker")) as sandbox:
        sandbox.start(ROWS["roman"])
        assert sandbox.run("id -u").output == "0\n"
        sandbox.container.reload()
        pid = sandbox.container.attrs["State"]["Pid"]
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
        assert all(int(uid) >= 65536 for uid in status["Uid"].split()), status["Uid"]


class _DefaultEngine:
    """A stand-in client whose engine runs with Docker's defaults (overlay2, no user namespace remapping): only
    `info()` and the address are asked before the sandbox refuses it."""

    class api:
        base_url = "stand-in://default-engine"

    @staticmethod
    def info():
        return {"Driver": "overlay2", "SecurityOptions": ["name=seccomp,profile=default"]}


def test_an_engine_without_private_files_or_userns_is_refused_or_named(client, caplog):
    from trl_multiturn.envs.swegym.sandbox import SandboxError
    from trl_multiturn.envs.swegym.sandbox.docker import engine_gaps

    assert engine_gaps(client.info()) == []  # the tests' engine has all of it
    gaps = engine_gaps(_DefaultEngine.info())
    assert len(gaps) == 2 and "overlay2" in gaps[0] and "--userns-remap" in gaps[1]
    refusing = DockerSandbox(SWEGymConfig(sandbox="docker", docker_engine_gaps="refuse"), client=_DefaultEngine())
    with pytest.raises(SandboxError, match="lacks what the sandbox needs.*overlay2.*userns-remap"):
        refusing.start(ROWS["roman"])
    warning = DockerSandbox(SWEGymConfig(sandbox="docker"), client=_DefaultEngine())
    with caplog.at_level("WARNING"):
        warning.check_engine()
    assert "overlay2" in caplog.text and "--userns-remap" in caplog.text
