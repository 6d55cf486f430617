"""SIGTERM or SIGINT to a training process stops every environment worker and the processes its environment started
(the worker's process group), and closes the environments (their host folders removed), leaving nothing behind; a
normal close reaps the children an environment's close() leaves running."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_env_pool import alive

from trl_multiturn import Environment, StepResult
from trl_multiturn.rollout import EnvPool

REPO = Path(__file__).resolve().parents[1]


class ChildStartingEnv(Environment):
    """At each reset, starts a `sleep` child and makes a host folder under `base` (like a sandbox checkout); close()
    removes the folder but, like many environments, does not reap the child. Records both under `base`."""

    def __init__(self, base: str, step_seconds: float = 0.0):
        self.base, self.step_seconds, self.folder = Path(base), step_seconds, None

    def reset(self, task):
        if self.folder is None:
            import tempfile

            self.folder = Path(tempfile.mkdtemp(prefix="sandbox-", dir=self.base))
            child = subprocess.Popen(["sleep", "600"])
            (self.base / f"pid-{child.pid}").write_text(str(os.getpid()))
        return "Say anything."

    def step(self, action):
        time.sleep(self.step_seconds)
        return StepResult("more", reward=1.0)

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


def wait_until(condition, timeout=300.0):
    deadline = time.monotonic() + timeout  # generous: a loaded 2-core machine; the condition ends the wait
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
    return condition()


def test_closing_the_pool_reaps_the_children_an_environment_left_running(tmp_path):
    """Before, the worker exited and was reaped first, and its process group (the `sleep`s) was never killed."""
    with EnvPool(lambda: ChildStartingEnv(str(tmp_path)), mode="process") as pool:
        pool.reset([{}, {}])
        pids = recorded_pids(tmp_path)
        assert len(pids) == 4 and all(alive(p) for p in pids)
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=30)
    assert list(tmp_path.glob("sandbox-*")) == []


def test_closing_the_pool_closes_an_environment_whose_call_hangs(tmp_path):
    """Before, a worker busy in a hung call was killed after 5 s without closing its environment: its folder stayed."""
    with EnvPool(lambda: ChildStartingEnv(str(tmp_path), step_seconds=600), mode="process") as pool:
        pool.reset([{}])
        pids = recorded_pids(tmp_path)
        pool.start_step([0], ["go"])
    assert list(tmp_path.glob("sandbox-*")) == []
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=30)


_TRAINER = """
import sys
from datasets import Dataset
from test_shutdown import ChildStartingEnv
from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
model, base, mode = sys.argv[1:]
args = MultiTurnGRPOConfig(output_dir=base + "/out", max_turns=50, num_generations=2, per_device_train_batch_size=4,
                           max_completion_length=4, max_steps=1000, use_cpu=True, bf16=False, report_to="none",
                           save_strategy="no", env_mode=mode,
                           action_parser="trl_multiturn.rollout.parsing:whole_reply")
trainer = MultiTurnGRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list([{"task": 1}] * 8),
                               environment_factory=lambda: ChildStartingEnv(base, step_seconds=0.05))
trainer.train()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_signal_to_the_trainer_leaves_no_process_and_no_folder_behind(tiny_chatml_model, tmp_path, mode, signum):
    """Before, SIGTERM ended the trainer at once: the workers died (parent-death signal) but their children were
    reparented to init, and every environment's folder stayed on disk."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    # SIGINT as in a terminal: a job a non-interactive shell starts in the background (CI's, often) inherits it
    # ignored, and Python then never raises KeyboardInterrupt.
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_TRAINER), tiny_chatml_model, str(tmp_path),
                                mode], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert wait_until(lambda: len(list(tmp_path.glob("pid-*"))) == 4 or trainer.poll() is not None)
        assert trainer.poll() is None, trainer.stderr.read()
        pids = [p for p in recorded_pids(tmp_path) if p != trainer.pid]  # thread mode: the trainer started them
        assert all(alive(p) for p in pids)
        time.sleep(1.0)  # well into the rollout
        trainer.send_signal(signum)
        trainer.wait(timeout=300)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode != 0
    assert list(tmp_path.glob("sandbox-*")) == []  # every environment was closed
    if mode == "process":
        assert wait_until(lambda: not any(alive(p) for p in pids), timeout=30), [p for p in pids if alive(p)]
    else:  # a thread-mode environment's children are the trainer's own: only its close() can reap them, and this
        for child in (int(f.name[4:]) for f in tmp_path.glob("pid-*")):  # test double's does not; clean up
            if alive(child):
                os.kill(child, signal.SIGKILL)
