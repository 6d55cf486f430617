"""EnvPool(mode="ray") on a real multi-node Ray cluster started on this machine (`ray.cluster_utils.Cluster`: a head
and a worker node, each with a custom resource of its own): episodes spread across nodes and placed by resources,
greedy rollouts equal to the process pool's, each fault of `FaultyEnv` failing only its episode, a node removed
mid-step failing only its episodes, and no actor (nor a local cluster the pool started) left after close or after
the owner is killed.

Deadlines are generous and hangs never return: the tests hold on a loaded machine."""

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from test_env_pool import play_one_step

from trl_multiturn.rollout import EnvFailure, EnvPool, EpisodeRunner
from trl_multiturn.rollout.ray_pool import RayPlacement
from trl_multiturn.rollout.rules import EpisodeRules
from trl_multiturn.testing import FaultyEnv

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

# Small fractions of a CPU: every actor of a test fits on the 1-CPU nodes at once.
SPREAD = RayPlacement(num_cpus=0.01, scheduling="SPREAD")
TIMEOUT = 30.0  # seconds: a healthy call returns in milliseconds; only the injected hangs reach it


@pytest.fixture(scope="module")
def cluster():
    """A head node and a worker node, each with 1 CPU and a custom resource naming it."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"head_node": 100},
                                                            "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1, resources={"worker_node": 100})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    cluster.worker = worker
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def live_env_actors(within: float = 60.0) -> list:
    """The environment actors of this cluster that are not dead (Ray's GCS actor table), once none is left or
    `within` seconds have passed: `ray.kill` returns before the GCS records the death."""
    end = time.monotonic() + within
    while True:
        alive = [a for a in ray._private.state.actors().values()
                 if a["ActorClassName"].endswith("_EnvActor") and a["State"] != "DEAD"]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.5)


def test_episodes_spread_across_nodes_and_custom_resources_place_them(cluster):
    with EnvPool(FaultyEnv, mode="ray", timeout=TIMEOUT, ray=SPREAD) as pool:
        assert all(r.won for r in play_one_step(pool, [{"target": 1}] * 4))
        assert len(set(pool.actor_nodes().values())) == 2
    pinned = RayPlacement(num_cpus=0.01, resources={"worker_node": 1})
    with EnvPool(FaultyEnv, mode="ray", timeout=TIMEOUT, ray=pinned) as pool:
        assert all(r.won for r in play_one_step(pool, [{"target": 1}] * 3))
        assert set(pool.actor_nodes().values()) == {cluster.worker.node_id}
    assert live_env_actors() == []


FAULT_REASONS = {"raise": "injected crash",
                 "hang": "timed out after 30.0s (its environment was closed and its actor killed)",
                 "exit": "environment actor died", "nan_reward": "reward is nan", "none_reward": "reward is NoneType",
                 "bad_observation": "observation is dict"}


def test_each_fault_fails_only_its_episode_and_its_slot_gets_a_fresh_actor(cluster):
    """Two hangs: with one deadline for the batch the step takes one `TIMEOUT`, waited one after another two."""
    faults = [*FAULT_REASONS, "hang"]
    tasks = [{"target": 1, "fault": f} for f in faults] + [{"target": 1}] * 2
    with EnvPool(FaultyEnv, mode="ray", timeout=TIMEOUT, ray=SPREAD) as pool:
        firsts = pool.reset(tasks)
        assert not any(isinstance(f, EnvFailure) for f in firsts)
        assert len(set(pool.actor_nodes().values())) == 2
        start = time.monotonic()
        results = pool.step(list(range(len(tasks))), ["go"] * len(tasks))
        assert time.monotonic() - start < 2 * TIMEOUT
        for fault, result in zip(faults, results):
            assert isinstance(result, EnvFailure) and FAULT_REASONS[fault] in result.reason, (fault, result)
        assert all(r.won for r in results[len(faults):])
        assert len(pool.actor_nodes()) == len(tasks) - 3  # the hangs' and the exit's actors are gone
        assert all(r.won for r in play_one_step(pool, [{"target": 1}] * len(tasks)))
    assert live_env_actors() == []


def test_a_hung_call_closes_its_environment_before_its_actor_is_killed(cluster, tmp_path):
    """The actor's second thread runs `close()` beside the call that hangs: what the environment started outside the
    actor (a container, a server) is stopped at the deadline, not left to the kill."""
    factory = functools.partial(FaultyEnv, closed_dir=str(tmp_path))
    tasks = [{"target": 1, "fault": "hang", "id": "hung"}, {"target": 2, "id": "healthy"}]
    with EnvPool(factory, mode="ray", timeout=5.0, ray=SPREAD) as pool:
        pool.reset(tasks)
        hung, healthy = pool.step([0, 1], ["go", "go"])
        assert isinstance(hung, EnvFailure) and "its environment was closed" in hung.reason
        assert not isinstance(healthy, EnvFailure) and not healthy.done
        assert sorted(os.listdir(tmp_path)) == ["hung"]  # closed at the deadline; the healthy one plays on
        assert len(pool.actor_nodes()) == 1
    assert sorted(os.listdir(tmp_path)) == ["healthy", "hung"]
    assert live_env_actors() == []


def test_greedy_rollouts_equal_the_process_pools(cluster, tiny_chatml_model):
    from rollout_checks import assert_token_exact
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiturn.rollout.generation import hf_generate_fn

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_chatml_model), AutoTokenizer.from_pretrained(
        tiny_chatml_model)
    rows = [{"target": 1}, {"target": 3}, {"target": 2}, {"fault": "raise", "fault_turn": 2}]
    played = {}
    for mode, schedule in (("process", "turn"), ("ray", "turn"), ("ray", "episode")):
        rules = EpisodeRules(max_turns=3, max_completion_length=5, action_parser=lambda reply: "go")
        runner = EpisodeRunner(FaultyEnv, tokenizer, hf_generate_fn(model, tokenizer), rules, env_mode=mode,
                               env_timeout=TIMEOUT, env_ray=SPREAD if mode == "ray" else None, schedule=schedule)
        try:
            played[mode, schedule] = runner(rows)
        finally:
            runner.close()
    for schedule in ("turn", "episode"):  # episode scheduling waits on the actors' calls one by one
        for ours, theirs in zip(played["ray", schedule], played["process", "turn"]):
            assert (ours.completion_ids, ours.env_mask, ours.turn_rewards, ours.won, ours.failure) == (
                theirs.completion_ids, theirs.env_mask, theirs.turn_rewards, theirs.won, theirs.failure)
            assert_token_exact(model, ours)
        assert [ep.won for ep in played["ray", schedule]] == [True, True, True, False]
        assert "injected crash" in played["ray", schedule][3].failure
    assert live_env_actors() == []


def test_a_node_removed_mid_step_fails_only_its_episodes_and_the_next_rollout_runs_on_the_rest(cluster):
    doomed = cluster.add_node(num_cpus=1, resources={"doomed_node": 100})
    cluster.wait_for_nodes()
    # Every first step takes 10 s, then succeeds: the removal (a second or two) lands while the doomed calls run.
    slow = functools.partial(FaultyEnv, hang_seconds=10.0)
    tasks = [{"target": 1, "fault": "hang"}] * 6
    with EnvPool(slow, mode="ray", timeout=120.0, ray=SPREAD) as pool:
        pool.reset(tasks)
        nodes = pool.actor_nodes()
        on_doomed = [slot for slot, node in nodes.items() if node == doomed.node_id]
        assert on_doomed and len(on_doomed) < len(tasks)
        pending = pool.start_step(list(range(len(tasks))), ["go"] * len(tasks))
        cluster.remove_node(doomed, allow_graceful=False)
        results = pending.results()
        for slot, result in enumerate(results):
            if slot in on_doomed:
                assert isinstance(result, EnvFailure) and "environment actor died" in result.reason, result
            else:
                assert result.won, result
        # Ray marks a removed node dead only after missed heartbeats (seconds, more on a busy machine); until then it
        # may still place a replacement actor there (that episode fails, the run goes on). Once it knows, the next
        # rollout runs on the rest.
        deadline = time.monotonic() + 120
        while any(n["NodeID"] == doomed.node_id and n["Alive"] for n in ray.nodes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        healthy = [{"target": 1}] * len(tasks)
        assert all(r.won for r in play_one_step(pool, healthy))
        assert doomed.node_id not in set(pool.actor_nodes().values())
    assert live_env_actors() == []


def test_a_trainer_with_env_mode_ray_fails_only_the_faulty_episodes_and_leaves_no_actor(cluster, tiny_chatml_model,
                                                                                         tmp_path):
    from conftest import tiny_rl_args
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, per_device_train_batch_size=4, num_generations=2, max_steps=1,
                        action_parser="trl_multiturn.rollout.parsing:whole_reply", reward_mode="dense",
                        env_mode="ray", env_timeout=TIMEOUT, env_ray_num_cpus=0.01, env_ray_scheduling="SPREAD")
    rows = [{"fault": "exit"}, {}]
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=FaultyEnv,
                                   train_dataset=Dataset.from_list(rows))
    trainer.train()
    episodes = trainer.last_rollout.episodes
    assert sorted(ep.failed for ep in episodes) == [False, False, True, True]
    assert all("environment actor died" in ep.failure for ep in episodes if ep.failed)
    assert live_env_actors() == []


_OWNER = """
import os, sys, time
import psutil
from trl_multiturn.rollout import EnvPool
from trl_multiturn.rollout.ray_pool import RayPlacement
from trl_multiturn.testing import FaultyEnv

pool = EnvPool(FaultyEnv, mode="ray", timeout=60.0, ray=RayPlacement(address="local", num_cpus=0.01))
assert not isinstance(pool.reset([{{"target": 1}}] * 2)[0], Exception)
ray_processes = [p.pid for p in psutil.Process().children(recursive=True)]
print(" ".join(map(str, ray_processes)), flush=True)
if {close}:
    pool.close()
    import ray
    print("initialized" if ray.is_initialized() else "shut down", flush=True)
else:
    time.sleep(3600)
"""


def gone(pids, within: float = 120.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids):
            return True
        time.sleep(0.5)
    return False


@pytest.mark.parametrize("close", [True, False], ids=["closed", "killed"])
def test_a_local_cluster_the_pool_started_is_gone_after_close_or_the_owners_death(close):
    """With address "local" (or none, and no cluster to join) the pool starts a local cluster (its GCS, raylet and
    workers: children of the owner): all of them end when the pool closes, or when its process is killed with SIGKILL
    (Ray's processes share its fate)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_OWNER.format(close=close))],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(pid) for pid in owner.stdout.readline().split()]
        assert len(pids) >= 3  # at least the GCS, the raylet and a worker
        if close:
            assert owner.stdout.readline().strip() == "shut down"
        else:
            owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=120)
        assert gone(pids)
    finally:
        owner.kill()
        owner.wait()


@pytest.mark.parametrize("settings,message", [
    (dict(env_ray_address="auto"), r"env_ray_address place environments on a Ray cluster, but env_mode='auto'"),
    (dict(env_mode="process", env_ray_scheduling="SPREAD"), r"env_ray_scheduling .* env_mode='process'"),
    (dict(env_mode="ray", env_ray_scheduling="PACK"), r"env_ray_scheduling='PACK': give one of"),
    (dict(env_mode="ray", env_ray_resources='{"gpu_free": -1}'), r"env_ray_resources\['gpu_free'\]=-1"),
    (dict(env_mode="ray", env_ray_resources='{"env_node": '), r"env_ray_resources='.*' is not valid JSON"),
    (dict(env_mode="ray", env_max_memory_mb=100), r"env_max_memory_mb needs env_mode='process'"),
])
def test_bad_ray_settings_name_the_field(settings, message, tmp_path):
    from trl_multiturn import MultiTurnGRPOConfig

    with pytest.raises(ValueError, match=message):
        MultiTurnGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **settings)


def test_ray_settings_reach_the_pool(tmp_path):
    from trl_multiturn import MultiTurnGRPOConfig

    config = MultiTurnGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", env_mode="ray",
                                 env_ray_resources='{"env_node": 0.5}', env_ray_num_cpus=0.25)
    assert config.ray_placement() == RayPlacement(num_cpus=0.25, resources={"env_node": 0.5})
