"""Nothing an agent puts in its sandbox blocks the trainer: the host-side file operations of the local sandbox
(the <create>/<view>/<replace> actions, the scratch files, the grading report) refuse FIFOs, devices and links
instead of waiting on them or following them; and a command cut at its wall-clock limit says so."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest

from trl_multiturn.envs import SWEGymEnv
from trl_multiturn.envs.swegym import LocalSandbox, SandboxConfig, SWEGymConfig, grade_patch, task_rows
from trl_multiturn.envs.swegym.patches import make_patch
from trl_multiturn.envs.swegym.sandbox.base import TIMEOUT_EXIT_CODE, SandboxPathError, timeout_note
from trl_multiturn.envs.swegym.tasks import task_sources

ROWS = {row["repo"].split("/")[1]: row for row in task_rows()}
SOURCES = {source.name: source for source in task_sources()}
# Far beyond any of these calls on a loaded machine; a call that blocks on a FIFO never returns at all.
PATIENCE_S = 120


@pytest.fixture
def config(swegym_cache_dir):
    return SWEGymConfig(repo_cache_dir=swegym_cache_dir, command_timeout=60, max_processes=48)


def finishes(call, *fifos):
    """`call()`'s result, or a failure if it is still waiting after PATIENCE_S (the FIFOs are then opened from
    this side, which releases a call blocked in `open`, so that the test process can end)."""
    result, error = [], []

    def target():
        try:
            result.append(call())
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            error.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(PATIENCE_S)
    if thread.is_alive():
        for fifo in fifos:
            os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
        thread.join(PATIENCE_S)
        pytest.fail(f"the call was still blocked after {PATIENCE_S} s: it waited on a FIFO")
    if error:
        raise error[0]
    return result[0]


def test_a_fifo_in_the_checkout_gets_an_error_observation(config):
    env = SWEGymEnv(config)
    env.reset(ROWS["roman"])
    try:
        made = env.step("<bash>mkfifo notes.txt && mkfifo roman/pipe.py && echo made</bash>")
        assert "made" in made.observation
        fifo = str(env.sandbox.host_workdir / "notes.txt")
        create = finishes(lambda: env.step('<create path="notes.txt">\nhello\n</create>'), fifo)
        assert create.observation.startswith("[error]") and "not a regular file" in create.observation
        pipe = str(env.sandbox.host_workdir / "roman/pipe.py")
        view = finishes(lambda: env.step('<view path="roman/pipe.py"/>'), pipe)
        assert view.observation.startswith("[error]") and not view.done
        assert env.step("<bash>test -p notes.txt && echo still a fifo</bash>").observation.startswith("still a fifo")
    finally:
        env.close()


def test_links_and_devices_are_refused(config, tmp_path):
    secret = tmp_path / "host_secret.txt"
    secret.write_text("host only\n")
    secret.chmod(0o644)
    with LocalSandbox(config) as sandbox:
        sandbox.start(ROWS["roman"])
        sandbox.run(f"ln -s {secret} leak.txt; ln -s /dev/zero zero.txt; ln -s README.md readme_link.md")
        for path in ("leak.txt", "zero.txt"):
            with pytest.raises(SandboxPathError):
                sandbox.read_file(path)
            with pytest.raises(SandboxPathError):
                sandbox.write_file(path, "overwritten\n")
        assert secret.read_text() == "host only\n"
        # a link inside the checkout is resolved inside it
        assert sandbox.read_file("readme_link.md") == sandbox.read_file("README.md")


def test_the_scratch_folder_cannot_be_swapped_for_a_fifo_or_a_link(config, tmp_path):
    with LocalSandbox(config) as sandbox:
        sandbox.start(ROWS["roman"])
        sandbox.write_scratch("report", "")
        sandbox.run("rm -f /tmp/swegym/report && mkfifo /tmp/swegym/report")
        fifo = str(sandbox._tmp / "tmp" / "swegym" / "report")
        assert finishes(lambda: sandbox.read_scratch("report"), fifo) is None
        assert sandbox.write_scratch("report", "fresh") == "/tmp/swegym/report"  # the FIFO is replaced, not opened
        assert sandbox.read_scratch("report") == "fresh"

        outside = tmp_path / "outside"
        outside.mkdir()
        outside.chmod(0o777)
        (outside / "report").write_text("planted by the agent")
        sandbox.run("mkdir -p /tmp/elsewhere && rm -rf /tmp/swegym && ln -s /tmp/elsewhere /tmp/swegym")
        assert sandbox.read_scratch("report") is None
        with pytest.raises(SandboxPathError):
            sandbox.write_scratch("token", "secret")


def test_fifos_in_the_grading_folder_neither_block_nor_steer_grading(swegym_cache_dir):
    """The package under test replaces every file of the grading folder that it can with a FIFO, when imported. The
    report takes the sandbox's channel, not a file of the folder, and no file of the folder is read after the tests
    start: the gold fix with that code resolves."""
    row = ROWS["roman"]
    module = SOURCES["roman"].files_at_base()["roman/convert.py"]
    planted = (
        "import os as _os\n"
        "for _name in _os.listdir('/tmp/swegym'):\n"
        "    if not _name.endswith(('.py', '.sh', '.patch')):\n"
        "        try:\n"
        "            _os.unlink('/tmp/swegym/' + _name)\n"
        "            _os.mkfifo('/tmp/swegym/' + _name)\n"
        "        except OSError:\n"
        "            pass\n"
    )
    patch = make_patch({"roman/convert.py": module}, {"roman/convert.py": planted + module}) + row["patch"]
    graded = finishes(lambda: grade_patch(row, patch, SandboxConfig(repo_cache_dir=swegym_cache_dir)))
    assert graded.resolved and graded.info()["grading_problem"] == ""


def test_a_command_cut_at_its_limit_says_so(config):
    with LocalSandbox(dataclasses.replace(config, command_timeout=1)) as sandbox:
        sandbox.start(ROWS["roman"])
        slow = sandbox.run("echo started; sleep 1000")
        assert slow.timed_out and slow.exit_code == TIMEOUT_EXIT_CODE
        assert slow.output == f"started\n{timeout_note(1)}\n"
        quick = sandbox.run("exit 3")
        assert not quick.timed_out and quick.exit_code == 3 and quick.output == ""
