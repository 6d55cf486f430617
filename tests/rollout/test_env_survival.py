"""What an environment's code raises or returns fails its own episode, never the run: any BaseException
(SystemExit, KeyboardInterrupt, GeneratorExit) from reset/step/close in every mode, and a result that pickles in the
worker but does not unpickle in the trainer. A user's Ctrl-C still stops the run."""

import os
import signal
import time

import pytest

from trl_multiturn import StepResult
from trl_multiturn.rollout import EnvFailure, EnvPool
from trl_multiturn.testing import FaultyEnv

RAISED = {"SystemExit": SystemExit(2), "KeyboardInterrupt": KeyboardInterrupt(), "GeneratorExit": GeneratorExit()}


class RaisingEnv(FaultyEnv):
    """Its step raises `RAISED[task["raise"]]`, from the environment's own code; its close raises SystemExit."""

    def reset(self, task):
        self.raised = task.get("raise")
        return super().reset(task)

    def step(self, action):
        if self.raised:
            raise RAISED[self.raised]
        return super().step(action)

    def close(self):
        raise SystemExit("close raised")


def play(pool, tasks):
    firsts = pool.reset(tasks)
    assert not any(isinstance(f, EnvFailure) for f in firsts)
    return pool.step(list(range(len(tasks))), ["go"] * len(tasks))


@pytest.mark.parametrize("mode", ["thread", "process", "inline"])
@pytest.mark.parametrize("name", list(RAISED))
def test_a_base_exception_in_a_step_fails_only_its_episode(mode, name):
    """A step that raises a BaseException (SystemExit, KeyboardInterrupt...) fails its episode in every mode: the
    thread-mode call is marked done (no hang, no timeout), and inline the exception does not end the run."""
    timeout = None if mode == "inline" else 120.0  # generous: a thread call never marked done would time out
    with EnvPool(RaisingEnv, mode=mode, timeout=timeout) as pool:
        results = play(pool, [{"raise": name, "target": 1}, {"target": 1}])
        assert isinstance(results[0], EnvFailure) and f"step raised {name}" in results[0].reason, results[0]
        assert isinstance(results[1], StepResult) and results[1].won
        assert all(r.won for r in play(pool, [{"target": 1}] * 2))  # the slot starts over with a fresh environment


def test_a_users_ctrl_c_during_an_inline_call_still_stops_the_run(ctrl_c_raises):
    class InterruptedEnv(FaultyEnv):
        def step(self, action):
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in the terminal delivers to the trainer
            time.sleep(60)

    with EnvPool(InterruptedEnv, mode="inline") as pool:
        pool.reset([{}])
        with pytest.raises(KeyboardInterrupt):
            pool.step([0], ["go"])


class TwoArgumentError(Exception):
    """Pickles (as its class and `args`) but does not unpickle: its `__init__` needs two arguments."""

    def __init__(self, path, reason):
        super().__init__(f"{path}: {reason}")


class UnreadableInfoEnv(FaultyEnv):
    def step(self, action):
        if self.fault == "unreadable_info":
            return StepResult("obs", info={"error": TwoArgumentError("a.py", "broken")})
        return super().step(action)


def test_a_result_that_does_not_unpickle_in_the_trainer_fails_its_episode():
    """A worker's result that fails to unpickle in the trainer (a TypeError in `conn.recv()`) fails its episode and
    the run goes on."""
    with EnvPool(UnreadableInfoEnv, mode="process") as pool:
        results = play(pool, [{"fault": "unreadable_info"}, {"target": 1}])
        assert isinstance(results[0], EnvFailure) and "could not be read back" in results[0].reason
        assert "TypeError" in results[0].reason and results[1].won
        assert all(r.won for r in play(pool, [{"target": 1}] * 2))  # the worker's pipe is still in step
