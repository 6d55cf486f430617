"""`check_environment`: the environment contract as code, as Gymnasium ships `check_env`.

Run it on your environment and one task row before training:

    from trl_multiturn.envs import check_environment
    check_environment(MyEnv, {"level": 3}, losing_actions=["jump into the pit"], bad_tasks=[{}, {"level": -1}])

Every check runs, and one `EnvironmentCheckError` lists every check that failed; on success it returns the names of
the checks that passed. The checks are what a trainer relies on (`base.py`, `rollout/env_pool.py`):

- `reset(task)` returns a str, and the same first observation for the same row (a task group starts from one state);
- the expert's actions (`expert_actions(task)` or the `expert_actions` argument) win through `step`: no result before
  the last is done, the last is done and won;
- a lost episode is not a win: `losing_actions` end the episode lost (done, not won); a nonsense action never wins;
- every `step` result is a `StepResult` with a str observation, a finite reward, truth-valued done/won and a dict
  info (`checked_step_result`), and pickles (process workers send results back to the trainer);
- `won=True` comes with `done=True` (the rollout reads `won` only when an episode ends);
- the environment is reused: `reset` after a finished episode starts a new one;
- `finish()` on a live episode returns None or a valid `StepResult`;
- each row of `bad_tasks` raises `TaskError`;
- `close()` is safe twice, and on an environment that never reset (given a factory);
- `execution` is "process" or "thread".
"""

from __future__ import annotations

import pickle
import reprlib
from collections.abc import Callable, Sequence
from typing import Any

from .base import Environment, StepResult, TaskError, checked_observation, checked_step_result

NONSENSE_ACTION = "xyzzy plugh frobnicate"
_METHODS = ("reset", "step", "close", "finish", "expert_actions")


class EnvironmentCheckError(AssertionError):
    """One or more checks of `check_environment` failed; `failures` holds one line per failed check."""

    def __init__(self, failures: list[str]):
        self.failures = failures
        lines = "\n".join(f"  - {failure}" for failure in failures)
        super().__init__(f"{len(failures)} environment contract check(s) failed:\n{lines}")


class _Failed(Exception):
    """A check's own verdict (as opposed to an exception the environment raised)."""


def check_environment(
    env_or_factory: Environment | Callable[[], Environment],
    task: dict,
    *,
    expert_actions: Sequence[str] | None = None,
    losing_actions: Sequence[str] | None = None,
    bad_tasks: Sequence[Any] = ({},),
    nonsense_action: str = NONSENSE_ACTION,
) -> list[str]:
    """Check an environment against the contract on one task row; raise `EnvironmentCheckError` listing every
    failed check, or return the names of the checks that passed.

    Args:
        env_or_factory: an environment instance, or the factory a trainer would get (`environment_factory`). With a
            factory, `close()` is also checked on an instance that never reset. The instance is closed at the end.
        task: one row the environment can play, with an expert solution.
        expert_actions: the winning actions for `task`; default `env.expert_actions(task)`.
        losing_actions: actions that end the episode of `task` lost, if the environment can lose; the last must
            give done=True, won=False. A nonsense action is checked not to win either way.
        bad_tasks: rows that must raise `TaskError` in `reset` (default: an empty row). Pass `()` if every row is
            valid for your environment.
        nonsense_action: an action the environment cannot act on.
    """
    factory = None if _is_instance(env_or_factory) else env_or_factory
    checker = _Checker()
    env = env_or_factory if factory is None else checker.run("the factory builds an environment", factory)
    if env is None:
        raise EnvironmentCheckError(checker.failures)
    try:
        checker.run("the environment has reset, step, close, finish and expert_actions", _check_methods, env)
        checker.run("execution is 'process' or 'thread'", _check_execution, env)
        first = checker.run("reset(task) returns a str", _reset, env, task)
        if first is not None:
            actions = checker.run("expert actions are a non-empty list of str", _expert_plan, env, task,
                                  expert_actions)
            if actions is not None:
                checker.run("the expert wins through step", _expert_wins, env, actions)
            again = checker.run("reset after a finished episode returns a str", _reset, env, task)
            if again is not None:
                checker.run("reset(task) is reproducible", _same_start, first, again)
            if losing_actions is not None:
                checker.run("the losing actions lose, and a loss is not a win", _losing_actions_lose, env, task,
                            losing_actions)
            checker.run("a nonsense action is not a win", _nonsense_is_not_a_win, env, task, nonsense_action)
            checker.run("finish() on a live episode returns None or a StepResult", _finish, env, task,
                        nonsense_action)
        for bad in bad_tasks:
            checker.run(f"reset({reprlib.repr(bad)}) raises TaskError", _raises_task_error, env, bad)
    finally:
        checker.run("close() twice is safe", _close_twice, env)
    if factory is not None:
        checker.run("close() without reset is safe", _close_fresh, factory)
    if checker.failures:
        raise EnvironmentCheckError(checker.failures)
    return checker.passed


class _Checker:
    def __init__(self):
        self.passed: list[str] = []
        self.failures: list[str] = []

    def run(self, name: str, check: Callable, *args):
        """The check's value, recorded as passed; or None, recorded as failed with the reason."""
        try:
            value = check(*args)
        except _Failed as exc:
            self.failures.append(f"{name}: {exc}")
            return None
        except Exception as exc:  # noqa: BLE001 - an environment error is a failed check, reported with the rest
            self.failures.append(f"{name}: raised {type(exc).__name__}: {exc}")
            return None
        self.passed.append(name)
        return value


def _is_instance(env_or_factory) -> bool:
    return isinstance(env_or_factory, Environment) or (
        not isinstance(env_or_factory, type) and all(hasattr(env_or_factory, m) for m in ("reset", "step")))


def _check_methods(env) -> None:
    missing = [m for m in _METHODS if not callable(getattr(env, m, None))]
    if missing:
        raise _Failed(f"{type(env).__name__} lacks {missing}: subclass trl_multiturn.Environment")


def _check_execution(env) -> None:
    mode = getattr(env, "execution", "process")
    if mode not in ("process", "thread"):
        raise _Failed(f"{type(env).__name__}.execution={mode!r}: use 'process' or 'thread'")


def _reset(env, task) -> str:
    return checked_observation(env.reset(task), "the first observation")


def _step(env, action: str) -> StepResult:
    result = checked_step_result(env.step(action))
    if result.won and not result.done:
        raise _Failed(f"step({action!r}) returned won=True with done=False: a won episode must end (done=True)")
    try:
        pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises
        raise _Failed(f"step({action!r}) returned a result that does not pickle ({type(exc).__name__}: {exc}); "
                      "process workers send results back to the trainer, keep info to plain data") from None
    return result


def _expert_plan(env, task, given) -> list[str]:
    actions = env.expert_actions(task) if given is None else given
    if actions is None:
        raise _Failed(f"{type(env).__name__}.expert_actions(task) returned None: implement it, or pass "
                      "check_environment(..., expert_actions=[...])")
    if isinstance(actions, str) or not all(isinstance(a, str) for a in actions) or not actions:
        raise _Failed(f"expert actions {reprlib.repr(actions)}: give a non-empty list of str")
    return list(actions)


def _play(env, actions: Sequence[str], what: str) -> StepResult:
    """The last result of `actions`; `_Failed` if the episode ends before the last action."""
    result = None
    for index, action in enumerate(actions):
        result = _step(env, action)
        if result.done and index < len(actions) - 1:
            raise _Failed(f"the episode ended (done=True, won={result.won}) at {what} action {index + 1} of "
                          f"{len(actions)} ({action!r})")
    return result


def _expert_wins(env, actions) -> None:
    last = _play(env, actions, "expert")
    if not (last.done and last.won):
        raise _Failed(f"after the last expert action {actions[-1]!r}: done={last.done}, won={last.won} (want both "
                      f"True); observation {reprlib.repr(last.observation)}")


def _same_start(first: str, again: str) -> None:
    if first != again:
        raise _Failed(f"two resets of one row began differently ({reprlib.repr(first)} vs {reprlib.repr(again)}): the "
                      "episodes of a task group must start from the same state; seed from the row")


def _losing_actions_lose(env, task, actions) -> None:
    _reset(env, task)
    last = _play(env, list(actions), "losing")
    if not last.done or last.won:
        raise _Failed(f"after the last losing action {actions[-1]!r}: done={last.done}, won={last.won} (want "
                      "done=True, won=False; won is the environment's verdict, never inferred from done)")


def _nonsense_is_not_a_win(env, task, action) -> None:
    _reset(env, task)
    if _step(env, action).won:
        raise _Failed(f"step({action!r}) right after reset won the episode")


def _finish(env, task, action) -> None:
    _reset(env, task)
    if _step(env, action).done:
        return  # the nonsense action ended the episode: nothing live to finish
    result = env.finish()
    if result is not None:
        checked_step_result(result)


def _raises_task_error(env, bad) -> None:
    try:
        env.reset(bad)
    except TaskError:
        return
    except Exception as exc:  # noqa: BLE001 - any other exception is the failure being reported
        raise _Failed(f"raised {type(exc).__name__}: {exc}; raise trl_multiturn.envs.TaskError naming the field "
                      "and the fix") from None
    raise _Failed("reset accepted it; raise trl_multiturn.envs.TaskError naming the field and the fix")


def _close_twice(env) -> None:
    env.close()
    env.close()


def _close_fresh(factory) -> None:
    factory().close()
