"""EnvPool: every call isolated to its episode (crash, hang, lost worker, broken contract), steps of all episodes at
once by default, workers released on close and on the owner's death, leaking workers restarted."""

import functools
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pytest
from processes import alive, wait_for_exit

from trl_multiturn import Environment, StepResult
from trl_multiturn.rollout import EnvFailure, EnvPool
from trl_multiturn.rollout.env_pool import resolve_env_mode
from trl_multiturn.testing import FaultyEnv

REPO = Path(__file__).resolve().parents[2]


def play_one_step(pool, tasks):
    firsts = pool.reset(tasks)
    live = [i for i, f in enumerate(firsts) if not isinstance(f, EnvFailure)]
    results = dict(zip(live, pool.step(live, ["go"] * len(live))))
    return [firsts[i] if isinstance(firsts[i], EnvFailure) else results[i] for i in range(len(tasks))]


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_crash_or_hang_fails_only_its_own_episode(mode):
    """Each slot is isolated: a crash, a hang or a lost worker fails its own episode, never another one sharing its
    worker."""
    faults = ["raise", "hang", "exit"] if mode == "process" else ["raise", "hang"]  # "exit" would end pytest
    tasks = [{"target": 1, "fault": f} for f in faults] + [{"target": 1}] * 6
    with EnvPool(FaultyEnv, mode=mode, timeout=3.0) as pool:
        results = play_one_step(pool, tasks)
        failed = [i for i, r in enumerate(results) if isinstance(r, EnvFailure)]
        assert failed == list(range(len(faults)))
        assert "injected crash" in results[0].reason and "timed out" in results[1].reason
        if mode == "process":
            assert "died" in results[2].reason
        assert all(r.won for r in results[len(faults):])
        # Every slot plays a healthy task next, the broken ones with a fresh environment.
        assert all(r.won for r in play_one_step(pool, [{"target": 1}] * len(tasks)))


class BoundedFaultyEnv(FaultyEnv):
    call_timeout = 2.0


def test_an_environment_declared_deadline_fails_a_hung_call_when_the_trainer_sets_none():
    """SWE-Gym's default: env_timeout None, yet a hung call fails its episode at the environment's `call_timeout`."""
    from trl_multiturn.envs.swegym import SWEGymEnv

    assert SWEGymEnv.call_timeout is not None and SWEGymEnv.call_timeout > 0
    with EnvPool(BoundedFaultyEnv, mode="thread") as pool:
        assert pool.timeout == 2.0
        results = play_one_step(pool, [{"target": 1, "fault": "hang"}, {"target": 1}])
        assert isinstance(results[0], EnvFailure) and "timed out after 2.0s" in results[0].reason
        assert results[1].won
    with EnvPool(BoundedFaultyEnv, mode="thread", timeout=7.0) as pool:
        assert pool.timeout == 7.0  # the trainer's value wins
    with EnvPool(BoundedFaultyEnv, mode="inline") as pool:
        assert pool.timeout is None  # an inline call cannot be interrupted


class ContractBreakingEnv(Environment):
    """Returns, at its first step, what `task["bad"]` names."""

    BAD = {
        "nan reward": StepResult("obs", reward=float("nan")),
        "inf reward": StepResult("obs", reward=float("-inf")),
        "None reward": StepResult("obs", reward=None),
        "string reward": StepResult("obs", reward="1.0"),
        "None observation": StepResult(None, reward=1.0),
        "int observation": StepResult(42, reward=1.0),
        "array done": StepResult("obs", done=np.array([True, False])),
        "array won": StepResult("obs", done=True, won=np.array([1, 1])),
        "list info": StepResult("obs", info=["a"]),
        "tuple result": ("obs", 1.0, True),
    }

    def reset(self, task):
        self.bad = task.get("bad")
        return {"text": "start"} if self.bad == "dict reset" else "start"

    def step(self, action):
        return self.BAD.get(self.bad, StepResult("fine", reward=np.float32(0.5), done=1, won=True))


@pytest.mark.parametrize("mode", ["inline", "thread", "process"])
def test_a_result_that_breaks_the_contract_fails_its_episode_with_the_reason(mode):
    expected = {
        "nan reward": "reward is nan", "inf reward": "reward is -inf", "None reward": "reward is NoneType",
        "string reward": "reward is str", "None observation": "observation is NoneType",
        "int observation": "observation is int", "array done": "done is ndarray", "array won": "won is ndarray",
        "list info": "info is list", "tuple result": "returned tuple", "dict reset": "first observation is dict",
    }
    tasks = [{"bad": name} for name in expected] + [{}]
    with EnvPool(ContractBreakingEnv, mode=mode) as pool:
        results = play_one_step(pool, tasks)
    for (name, reason), result in zip(expected.items(), results):
        assert isinstance(result, EnvFailure), name
        assert "broke the environment contract" in result.reason and reason in result.reason, (name, result.reason)
    healthy = results[-1]
    assert healthy == StepResult("fine", reward=0.5, done=True, won=True)
    assert type(healthy.reward) is float and healthy.done is True


class BarrierEnv(Environment):
    """Each step waits until every episode's step has started: it can only finish if they all run at once."""

    def __init__(self, barrier):
        self.barrier = barrier

    def reset(self, task):
        return "meet the others"

    def step(self, action):
        self.barrier.wait(timeout=3)  # raises BrokenBarrierError when the others never come
        return StepResult("met", reward=1.0, done=True, won=True)


@pytest.mark.parametrize("mode,concurrent", [("auto", True), ("thread", True), ("inline", False)])
def test_steps_of_all_episodes_run_at_once_by_default(mode, concurrent):
    barrier = mp.get_context("fork").Barrier(4)
    with EnvPool(functools.partial(BarrierEnv, barrier), mode=mode) as pool:
        results = play_one_step(pool, [{}] * 4)
    won = [isinstance(r, StepResult) and r.won for r in results]
    assert won == [concurrent] * 4  # inline steps one after another: the first waits alone and breaks the barrier


def test_auto_mode_is_what_the_environment_declares():
    from trl_multiturn.envs import ALFWorldEnv, SWEGymEnv, TextWorldEnv

    def swe_factory():
        return SWEGymEnv()

    swe_factory.execution = "thread"
    assert resolve_env_mode("auto", TextWorldEnv) == "process"
    assert resolve_env_mode("auto", functools.partial(ALFWorldEnv, {})) == "process"
    assert resolve_env_mode("auto", functools.partial(SWEGymEnv, max_turns=3)) == "thread"
    assert resolve_env_mode("auto", swe_factory) == "thread"
    assert resolve_env_mode("auto", lambda: SWEGymEnv()) == "process"  # declares nothing: the safe choice
    assert resolve_env_mode("inline", SWEGymEnv) == "inline"
    with pytest.raises(ValueError, match="env_mode='fast'"):
        resolve_env_mode("fast", TextWorldEnv)


def test_every_mode_is_one_runner_chosen_once():
    """Each mode is an `EnvRunner` in `RUNNERS`, chosen when the pool is built; the pool's methods never ask which mode
    they run (no comparison with a mode, no test of a runner's type), so a new mode is a runner and a table line."""
    import ast
    import inspect

    from trl_multiturn.rollout import env_pool
    from trl_multiturn.rollout.env_runner import EnvRunner

    assert env_pool.ENV_MODES == ("auto", "process", "thread", "ray", "inline")
    assert all(issubclass(r, EnvRunner) and not inspect.isabstract(r) for r in env_pool.RUNNERS.values())
    for mode in ("process", "thread", "inline"):  # (Ray's: tests/rollout/test_ray_pool.py)
        with EnvPool(FaultyEnv, mode=mode) as pool:
            assert type(pool.runner) is env_pool.RUNNERS[mode]
            assert all(r.won for r in play_one_step(pool, [{"target": 1}] * 2))
    branches = []
    for cls in (env_pool.EnvPool, env_pool.PendingCalls):
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
            if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Constant) and side.value in env_pool.ENV_MODES
                    for side in (node.left, *node.comparators)):
                branches.append(ast.unparse(node))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                branches.append(ast.unparse(node))
    assert branches == []


def test_close_stops_every_worker_and_the_pool_starts_again_on_demand():
    pool = EnvPool(FaultyEnv, mode="process")
    play_one_step(pool, [{"target": 1}] * 3)
    pids = pool.worker_pids()
    assert len(pids) == 3 and all(alive(p) for p in pids)
    pool.close()
    assert pool.worker_pids() == [] and not any(alive(p) for p in pids)
    assert all(r.won for r in play_one_step(pool, [{"target": 1}] * 2))
    pool.close()


_OWNER = """
from trl_multiturn.rollout import EnvPool
from trl_multiturn.testing import FaultyEnv

class ReportingFaultyEnv(FaultyEnv):
    def step(self, action):
        print("hanging", flush=True)  # the worker inherits the owner's stdout
        return super().step(action)

pool = EnvPool(ReportingFaultyEnv, mode="process")
pool.reset([{"fault": "hang"}, {}, {}])
print(" ".join(map(str, pool.worker_pids())), flush=True)
pool.step([0], ["go"])  # hangs: no deadline
"""


def test_workers_die_with_the_process_that_owns_the_pool():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_OWNER)], stdout=subprocess.PIPE, env=env,
                             text=True)
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        assert owner.stdout.readline() == "hanging\n"  # the first worker is inside its hanging step
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_for_exit(pids)


class LeakyEnv(FaultyEnv):
    """Keeps 40 MiB more at every reset."""

    kept = []

    def reset(self, task):
        LeakyEnv.kept.append(bytearray(b"x") * (40 * 2**20))
        return super().reset(task)


@pytest.mark.parametrize("limit", [None, 100])
def test_a_leaking_environment_is_restarted_past_the_memory_limit(limit):
    with EnvPool(LeakyEnv, mode="process", max_memory_mb=limit) as pool:
        pids, used = set(), []
        for _ in range(5):
            assert not isinstance(pool.reset([{}])[0], EnvFailure)
            pids.add(pool.worker_pids()[0])
            used.append(psutil.Process(pool.worker_pids()[0]).memory_full_info().uss / 2**20)
    if limit is None:
        assert len(pids) == 1 and pool.restarts == 0 and used[-1] > 200
    else:
        assert len(pids) >= 2 and pool.restarts >= 1 and max(used) < limit + 60


def test_a_result_the_worker_cannot_send_back_fails_its_episode():
    class Unpicklable(FaultyEnv):
        def step(self, action):
            return StepResult("obs", info={"callback": lambda: None})

    with EnvPool(Unpicklable, mode="process") as pool:
        result = play_one_step(pool, [{}])[0]
    assert isinstance(result, EnvFailure) and "cannot send back" in result.reason


@pytest.mark.parametrize("factory,kwargs,message", [
    ("FaultyEnv", {"timeout": 0}, "env_timeout=0"),
    ("FaultyEnv", {"timeout": -1.0}, "env_timeout=-1.0"),
    ("FaultyEnv", {"mode": "inline", "timeout": 5}, "env_timeout needs env_mode"),
    ("FaultyEnv", {"max_memory_mb": 0}, "env_max_memory_mb=0"),
    ("FaultyEnv", {"mode": "thread", "max_memory_mb": 500}, "env_max_memory_mb needs worker processes"),
    ("SWEGymEnv", {"max_memory_mb": 500}, "needs worker processes, and the environments run in mode 'thread'"),
])
def test_bad_pool_settings_name_the_field(factory, kwargs, message):
    from trl_multiturn.envs import SWEGymEnv  # declares threads: "auto" resolves to them

    with pytest.raises(ValueError, match=message):
        EnvPool({"FaultyEnv": FaultyEnv, "SWEGymEnv": SWEGymEnv}[factory], **kwargs)
