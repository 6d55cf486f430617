"""`check_environment` passes a correct environment and names each way an environment can break the contract.

Each broken environment below is `CountingEnv` (a correct user environment) with one fault; the test asserts that
the check for that fault, and no other, fails.
"""

import math
import threading

import pytest
from toy_envs import CountingEnv, FlakyEnv

from trl_multiturn import StepResult
from trl_multiturn.envs import EnvironmentCheckError, check_environment

TASK = {"target": 2}


def failures_of(env_or_factory, **kwargs) -> list[str]:
    with pytest.raises(EnvironmentCheckError) as info:
        check_environment(env_or_factory, TASK, **kwargs)
    assert str(info.value).count("\n  - ") == len(info.value.failures)  # the message lists every failure
    return info.value.failures


def test_a_correct_environment_passes_every_check():
    passed = check_environment(CountingEnv, TASK, losing_actions=["lose"], bad_tasks=[{}, {"target": "two"}])
    assert len(passed) == 15
    assert "the expert wins through step" in passed
    assert "the losing actions lose, and a loss is not a win" in passed
    assert "reset({'target': 'two'}) raises TaskError" in passed
    assert "close() without reset is safe" in passed  # a factory was given
    assert "close() without reset is safe" not in check_environment(CountingEnv(), TASK)  # an instance
    assert len(check_environment(FlakyEnv, {**TASK, "mode": "ok"}, losing_actions=["lose"])) == 14
    with pytest.raises(EnvironmentCheckError, match="the expert wins through step: raised RuntimeError: engine "
                                                    "crashed"):
        check_environment(FlakyEnv, {**TASK, "mode": "raise"})


class ExpertNeverWins(CountingEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(result.observation, result.reward, result.done, won=False)


class EndsAtOnce(CountingEnv):
    def step(self, action):
        return StepResult("over", done=True, won=action == "count")


class LossIsAWin(CountingEnv):
    """Infers won from done."""

    def step(self, action):
        result = super().step(action)
        return StepResult(result.observation, result.reward, result.done, won=result.done)


class WonButNotDone(CountingEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(result.observation, result.reward, done=False, won=True)


class NonsenseWins(CountingEnv):
    def step(self, action):
        if "xyzzy" in action:
            return StepResult("you win", done=True, won=True)
        return super().step(action)


class BadRowIsKeyError(CountingEnv):
    def reset(self, task):
        self.turn, self.target = 0, task["target"]
        return "Count."


class CloseTwiceFails(CountingEnv):
    def close(self):
        if getattr(self, "closed", False):
            raise RuntimeError("already closed")
        self.closed = True


class CloseBeforeResetFails(CountingEnv):
    def close(self):
        self.target.bit_length()  # AttributeError before the first reset


class BytesObservation(CountingEnv):
    def reset(self, task):
        return super().reset(task).encode()


class ObservationNone(CountingEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(None, result.reward, result.done, result.won)


@pytest.mark.parametrize("reward", [math.nan, math.inf, None, "1"])
def test_a_reward_that_is_no_finite_number_fails_the_step_checks(reward):
    class BadReward(CountingEnv):
        def step(self, action):
            result = super().step(action)
            return StepResult(result.observation, reward, result.done, result.won)

    failures = failures_of(BadReward)
    assert failures and all("reward" in f for f in failures)
    assert any(f.startswith("the expert wins through step:") for f in failures)


class ReturnsATuple(CountingEnv):
    def step(self, action):
        result = super().step(action)
        return result.observation, result.reward, result.done, result.won, {}


class UnpicklableInfo(CountingEnv):
    def step(self, action):
        result = super().step(action)
        result.info["lock"] = threading.Lock()
        return result


class RandomStart(CountingEnv):
    starts = 0

    def reset(self, task):
        super().reset(task)
        RandomStart.starts += 1
        return f"Start number {RandomStart.starts}"


class BadFinish(CountingEnv):
    def finish(self):
        return {"reward": 1.0}


class NoExpert(CountingEnv):
    def expert_actions(self, task):
        return None


class ExpertIsAString(CountingEnv):
    def expert_actions(self, task):
        return "count count"


class BadExecution(CountingEnv):
    execution = "gpu"


class NotReusable(CountingEnv):
    def reset(self, task):
        if getattr(self, "used", False):
            raise RuntimeError("reset twice")
        self.used = True
        return super().reset(task)


class NoMethods:
    def reset(self, task):
        return "hello"

    def step(self, action):
        return StepResult("ok", done=action == "go", won=action == "go")


BROKEN = [
    (ExpertNeverWins, "the expert wins through step", "won=False"),
    (EndsAtOnce, "the expert wins through step", "at expert action 1 of 2"),
    (LossIsAWin, "the losing actions lose, and a loss is not a win", "never inferred from done"),
    (WonButNotDone, "the expert wins through step", "won=True with done=False"),
    (NonsenseWins, "a nonsense action is not a win", "won the episode"),
    (BadRowIsKeyError, "reset({}) raises TaskError", "raised KeyError"),
    (CloseTwiceFails, "close() twice is safe", "already closed"),
    (CloseBeforeResetFails, "close() without reset is safe", "AttributeError"),
    (BytesObservation, "reset(task) returns a str", "bytes"),
    (ObservationNone, "the expert wins through step", "observation is NoneType"),
    (ReturnsATuple, "the expert wins through step", "not a StepResult"),
    (UnpicklableInfo, "the expert wins through step", "does not pickle"),
    (RandomStart, "reset(task) is reproducible", "same state"),
    (BadFinish, "finish() on a live episode returns None or a StepResult", "not a StepResult"),
    (NoExpert, "expert actions are a non-empty list of str", "expert_actions=[...]"),
    (ExpertIsAString, "expert actions are a non-empty list of str", "non-empty list of str"),
    (BadExecution, "execution is 'process' or 'thread'", "'gpu'"),
    (NotReusable, "reset after a finished episode returns a str", "reset twice"),
]


@pytest.mark.parametrize("env_cls, check, reason", BROKEN, ids=[cls.__name__ for cls, _, _ in BROKEN])
def test_each_broken_environment_fails_its_own_check(env_cls, check, reason):
    failures = failures_of(env_cls, losing_actions=["lose"])
    named = [f for f in failures if f.startswith(check + ":")]
    assert named and reason in named[0], failures
    # The fault is not blamed on anything else (a step fault shows in every check that steps).
    assert all(reason in f for f in failures), failures


def test_every_failure_is_listed_in_one_error():
    class ManyFaults(BadRowIsKeyError, CloseTwiceFails, ExpertNeverWins):
        execution = "gpu"

    failures = failures_of(ManyFaults)
    assert [f.split(":")[0] for f in failures] == [
        "execution is 'process' or 'thread'", "the expert wins through step", "reset({}) raises TaskError",
        "close() twice is safe"]


def test_an_object_without_the_optional_methods_is_told_to_subclass():
    failures = failures_of(NoMethods(), expert_actions=["go"], bad_tasks=())
    assert failures == ["the environment has reset, step, close, finish and expert_actions: NoMethods lacks "
                        "['close', 'finish', 'expert_actions']: subclass trl_multiturn.Environment",
                        "finish() on a live episode returns None or a StepResult: raised AttributeError: 'NoMethods' "
                        "object has no attribute 'finish'",
                        "close() twice is safe: raised AttributeError: 'NoMethods' object has no attribute 'close'"]


def test_a_factory_that_raises_is_reported():
    def factory():
        raise OSError("engine not installed")

    assert failures_of(factory) == ["the factory builds an environment: raised OSError: engine not installed"]
