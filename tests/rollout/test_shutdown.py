"""SIGTERM or SIGINT to a training process stops every environment worker and the processes its environment started
(the worker's process group), and closes the environments (their host folders removed), leaving nothing behind; a
normal close reaps the children an environment's close() leaves running."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from processes import alive, wait_for_exit

from trl_multiturn import Environment, StepResult
from trl_multiturn.rollout import EnvPool

REPO = Path(__file__).resolve().parents[2]


class ChildStartingEnv(Environment):
    """At each reset, starts a `sleep` child and makes a host folder under `base` (like a sandbox checkout); close()
    removes the folder but, like many environments, does not reap the child. Records both under `base`, and with
    `report_fd` (a pipe's writing end) reports "child" when it has, and "step" when its first step starts."""

    def __init__(self, base: str, step_seconds: float = 0.0, report_fd: int | None = None):
        self.base, self.step_seconds, self.folder = Path(base), step_seconds, None
        self.report_fd, self.stepped = report_fd, False

    def reset(self, task):
        if self.folder is None:
            import tempfile

            self.folder = Path(tempfile.mkdtemp(prefix="sandbox-", dir=self.base))
            child = subprocess.Popen(["sleep", "600"])
            (self.base / f"pid-{child.pid}").write_text(str(os.getpid()))
            self._report("child")
        return "Say anything."

    def step(self, action):
        if not self.stepped:
            self.stepped = True
            self._report("step")
        time.sleep(self.step_seconds)  # a slow environment: the rollout lasts while the signal comes
        return StepResult("more", reward=1.0)

    def _report(self, what: str) -> None:
        if self.report_fd is not None:
            os.write(self.report_fd, f"{what}\n".encode())

    def close(self):
        if self.folder is not None:
            import shutil

            shutil.rmtree(self.folder)


def recorded_pids(base: Path) -> list[int]:
    """The environments' children and the processes (workers) that started them."""
    pids = []
    for f in base.glob("pid-*"):
        pids += [int(f.name[4:]), int(f.read_text())]
    return pids


def read_reports(fd: int, enough, timeout: float = 300.0) -> list[str]:
    """The environments' reports read from the pipe `fd` until `enough(reports)` or the end of the pipe (every writer
    has exited); `timeout` only stops a broken test from hanging."""
    text, deadline = "", time.monotonic() + timeout
    while not enough(text.split()):
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        text += chunk.decode()
    return text.split()


def test_closing_the_pool_reaps_the_children_an_environment_left_running(tmp_path):
    """Closing the pool kills each worker's process group (the `sleep`s its environment started), not only the
    worker, and reaps every one of them."""
    with EnvPool(lambda: ChildStartingEnv(str(tmp_path)), mode="process") as pool:
        pool.reset([{}, {}])
        pids = recorded_pids(tmp_path)
        assert len(pids) == 4 and all(alive(p) for p in pids)
    assert wait_for_exit(pids)
    assert list(tmp_path.glob("sandbox-*")) == []


def test_closing_the_pool_closes_an_environment_whose_call_hangs(tmp_path):
    """Closing the pool while a worker is busy in a hung call still closes that worker's environment: its folder is
    removed."""
    with EnvPool(lambda: ChildStartingEnv(str(tmp_path), step_seconds=600), mode="process") as pool:
        pool.reset([{}])
        pids = recorded_pids(tmp_path)
        pool.start_step([0], ["go"])
    assert list(tmp_path.glob("sandbox-*")) == []
    assert wait_for_exit(pids)


_TRAINER = """
import sys
from datasets import Dataset
from test_shutdown import ChildStartingEnv
from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
model, base, mode, report_fd = sys.argv[1:]
args = MultiTurnGRPOConfig(output_dir=base + "/out", max_turns=50, num_generations=2, per_device_train_batch_size=4,
                           max_completion_length=4, max_steps=1000, use_cpu=True, bf16=False, report_to="none",
                           save_strategy="no", env_mode=mode,
                           action_parser="trl_multiturn.rollout.parsing:whole_reply")
trainer = MultiTurnGRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list([{"task": 1}] * 8),
                               environment_factory=lambda: ChildStartingEnv(base, 0.05, int(report_fd)))
trainer.train()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_signal_to_the_trainer_leaves_no_process_and_no_folder_behind(tiny_chatml_model, tmp_path, mode, signum):
    """SIGTERM or SIGINT unwinds the trainer: every worker, every child of a worker and every environment's folder is
    gone when it has exited (not one child reparented to init, not one folder left on disk)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}:{Path(__file__).resolve().parent}"}  # test_shutdown
    # SIGINT as in a terminal: a job a non-interactive shell starts in the background (CI's, often) inherits it
    # ignored, and Python then never raises KeyboardInterrupt.
    reports, report_fd = os.pipe()  # the environments write to it (the trainer's workers inherit it)
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_TRAINER), tiny_chatml_model, str(tmp_path),
                                mode, str(report_fd)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, pass_fds=(report_fd,),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(report_fd)
    try:
        # Every environment started its child, and the rollout is stepping them (the end of the pipe: the trainer
        # is gone).
        seen = read_reports(reports, lambda seen: seen.count("child") == 4 and "step" in seen)
        assert trainer.poll() is None and seen.count("child") == 4 and "step" in seen, trainer.stderr.read()
        pids = [p for p in recorded_pids(tmp_path) if p != trainer.pid]  # thread mode: the trainer started them
        assert all(alive(p) for p in pids)
        trainer.send_signal(signum)
        trainer.wait(timeout=300)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        os.close(reports)
    assert trainer.returncode != 0
    assert list(tmp_path.glob("sandbox-*")) == []  # every environment was closed
    if mode == "process":
        assert wait_for_exit(pids), [p for p in pids if alive(p)]
    else:  # a thread-mode environment's children are the trainer's own: only its close() can reap them, and this
        for child in (int(f.name[4:]) for f in tmp_path.glob("pid-*")):  # test double's does not; clean up
            if alive(child):
                os.kill(child, signal.SIGKILL)
