"""OpenEnv both ways, against real servers on loopback: `trl-multiturn serve --env textworld` played by OpenEnv's
own client, and by `OpenEnvEnvironment` exactly as the in-process `TextWorldEnv` plays; a server that dies, hangs
or answers garbage fails its episode only; a GRPO run trains on a served TextWorld.

Every server is a real `trl-multiturn serve` subprocess started here (`LocalServer`), except the garbage server,
a fake named as such: a few lines of `websockets` that answer what no OpenEnv server would.
"""

import asyncio
import itertools
import json
import math
import os
import re
import signal
import threading
import time
from functools import partial

import pytest

pytest.importorskip("openenv.core", reason="needs the `openenv` extra (openenv-core)")

from openenv.core import GenericEnvClient  # noqa: E402

from trl_multiturn.commands.serve import LocalServer  # noqa: E402
from trl_multiturn.envs import TextWorldEnv, check_environment  # noqa: E402
from trl_multiturn.envs.openenv import OpenEnvConfig, OpenEnvEnvironment, OpenEnvError  # noqa: E402
from trl_multiturn.rollout.env_pool import EnvFailure, EnvPool  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

CUSTOM = {"world_size": 2, "nb_objects": 3, "quest_length": 4}
TASKS = [{**CUSTOM, "seed": 0}, {"challenge": "tw-simple", "rewards": "dense", "goal": "detailed", "seed": 0}]


@pytest.fixture(scope="module")
def server(textworld_games_dir):
    """One served TextWorld for the module; `reset(seed=N)` alone plays custom game N (`--task`)."""
    with LocalServer("textworld", {"games_dir": str(textworld_games_dir)}, "--task", json.dumps(CUSTOM)) as served:
        yield served


def children(pid: int) -> list[int]:
    return [int(child) for task in os.listdir(f"/proc/{pid}/task")
            for child in open(f"/proc/{pid}/task/{task}/children").read().split()]


@pytest.fixture
def local(textworld_games_dir):
    env = TextWorldEnv(games_dir=str(textworld_games_dir))
    yield env
    env.close()


def test_a_served_environment_and_its_session_workers_never_load_torch(server):
    """The server needs no model: without torch it starts in a few seconds and about 0.3 GB smaller, and so does
    every session worker it forks (the CLI imports the training commands' modules only when they run)."""
    with GenericEnvClient(base_url=server.url).sync() as client:
        client.reset(task=TASKS[0])
        workers = children(server.process.pid)
        assert workers  # the session's environment runs in a forked worker
        for pid in [server.process.pid, *workers]:
            maps = open(f"/proc/{pid}/maps").read()
            assert "libtorch" not in maps and "libc10" not in maps, f"process {pid} loaded torch"


def test_openenvs_own_client_plays_served_textworld_to_a_win(server, local):
    task = TASKS[0]
    walkthrough = local.expert_actions(task)
    with GenericEnvClient(base_url=server.url).sync() as client:
        first = client.reset(task=task)
        assert first.observation["text"] == local.reset(task) and not first.done
        results = [client.step({"message": action}) for action in walkthrough]
        assert [r.done for r in results] == [False] * (len(walkthrough) - 1) + [True]
        last = results[-1]
        assert last.observation["won"] and not last.observation["info"]["lost"]
        assert sum(r.reward for r in results) == last.observation["info"]["max_score"] > 0
        # --task: the seed alone names a custom game; the same session plays on.
        again = client.reset(seed=1)
        assert again.observation["text"] == local.reset({**CUSTOM, "seed": 1})


@pytest.mark.parametrize("task", TASKS, ids=["custom", "tw-simple"])
def test_the_adapter_plays_as_the_in_process_environment(server, local, task):
    """Observation, reward, done, won and info of every turn are the in-process ones, over a refused command and a
    parser error too, for two episodes of one session."""
    remote = OpenEnvEnvironment(base_url=server.url)
    try:
        for _ in range(2):
            assert remote.reset(task) == local.reset(task)
            for action in ["restart", "xyzzy plugh", *local.expert_actions(task)]:
                expected, got = local.step(action), remote.step(action)
                expected.info = json.loads(json.dumps(expected.info))
                assert got == expected
            assert got.done and got.won
    finally:
        remote.close()


def test_the_adapter_meets_the_environment_contract(server, local):
    task = TASKS[1]
    *steps, put_on_stove = local.expert_actions(task)
    losing = [*steps, f"eat {re.fullmatch(r'put (.+) on stove', put_on_stove).group(1)}"]
    passed = check_environment(partial(OpenEnvEnvironment, base_url=server.url), task,
                               expert_actions=local.expert_actions(task), losing_actions=losing, bad_tasks=())
    assert "the losing actions lose, and a loss is not a win" in passed


def test_a_bad_task_row_fails_with_the_servers_reason(server):
    remote = OpenEnvEnvironment(base_url=server.url)
    with pytest.raises(OpenEnvError, match=r"reset failed .*TaskError.*game_file"):
        remote.reset({"game_file": "/nowhere/game.z8"})
    with pytest.raises(OpenEnvError, match="no open session"):
        remote.step("look")  # the failed session was dropped
    assert remote.reset(TASKS[0])  # and the next reset opens a fresh one
    remote.close()


def test_a_server_killed_mid_episode_fails_its_episodes_only(textworld_games_dir, local):
    """Two servers, one episode on each (thread pool, as the trainers run the adapter): killing one fails its
    episode, the other plays on to a win; a fresh server on the killed one's port serves the next episode."""
    options = {"games_dir": str(textworld_games_dir)}
    task = TASKS[0]
    walkthrough = local.expert_actions(task)
    with LocalServer("textworld", options) as doomed, LocalServer("textworld", options) as survivor:
        urls = itertools.cycle([doomed.url, survivor.url])
        lock = threading.Lock()

        def factory():
            with lock:
                return OpenEnvEnvironment(base_url=next(urls), message_timeout=60)

        with EnvPool(factory, mode="thread", timeout=300) as pool:
            assert not any(isinstance(r, EnvFailure) for r in pool.reset([task, task]))
            doomed.kill()
            results = pool.step([0, 1], walkthrough[:1] * 2)
            [failed] = [slot for slot, r in enumerate(results) if isinstance(r, EnvFailure)]
            assert doomed.url in results[failed].reason and "step failed" in results[failed].reason
            alive = 1 - failed
            for action in walkthrough[1:]:
                [last] = pool.step([alive], [action])
            assert last.done and last.won

            with LocalServer("textworld", options, port=doomed.port):
                assert not any(isinstance(r, EnvFailure) for r in pool.reset([task, task]))
                for action in walkthrough:
                    results = pool.step([0, 1], [action, action])
                assert all(r.done and r.won for r in results)


def test_closing_a_server_leaves_no_process_behind(textworld_games_dir):
    """The server and its sessions' environment workers end with `close()` (SIGTERM), even with a session open."""
    import psutil

    server = LocalServer("textworld", {"games_dir": str(textworld_games_dir)}).start()
    remote = OpenEnvEnvironment(base_url=server.url)
    assert remote.reset(TASKS[0])
    processes = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
    assert len(processes) >= 2  # the server and the session's worker
    server.close()
    gone, alive = psutil.wait_procs(processes, timeout=120)
    assert not alive, alive
    with pytest.raises(OpenEnvError, match="step failed"):
        remote.step("go south")


def test_an_adapter_dropped_without_close_ends_its_session(server):
    """The session (and the server's environment worker behind it) ends when the adapter is garbage, not when the
    client process exits: OpenEnv's sync client runs a thread that would keep it open."""
    import gc

    import psutil

    before = {p.pid for p in psutil.Process(server.process.pid).children(recursive=True)}
    remote = OpenEnvEnvironment(base_url=server.url)
    assert remote.reset(TASKS[0])
    session = [p for p in psutil.Process(server.process.pid).children(recursive=True) if p.pid not in before]
    assert session  # the session's environment worker
    del remote
    gc.collect()
    gone, alive = psutil.wait_procs(session, timeout=120)
    assert not alive, alive


def test_a_stopped_server_fails_the_reset_after_connect_timeout(textworld_games_dir):
    """A real server frozen (SIGSTOP): the kernel still accepts the connection, nothing answers the handshake."""
    with LocalServer("textworld", {"games_dir": str(textworld_games_dir)}) as stopped:
        os.kill(stopped.process.pid, signal.SIGSTOP)
        try:
            remote = OpenEnvEnvironment(base_url=stopped.url, connect_timeout=5)
            start = time.monotonic()
            with pytest.raises(OpenEnvError, match=r"reset failed \(ConnectionError: Failed to connect"):
                remote.reset(TASKS[0])
            assert time.monotonic() - start < 300  # bounded by the timeout, not by the server
        finally:
            os.kill(stopped.process.pid, signal.SIGCONT)


def test_an_unreachable_server_fails_the_reset():
    from trl_multiturn.commands.serve import free_port

    remote = OpenEnvEnvironment(base_url=f"http://127.0.0.1:{free_port()}", connect_timeout=5)
    with pytest.raises(OpenEnvError, match="reset failed .*ConnectionError"):
        remote.reset(TASKS[0])


class _GarbageServer:
    """A fake (no OpenEnv server sends these): a WebSocket server answering the k-th message of a connection with
    `replies[k]` (the last one for every later message); None: no answer at all."""

    def __init__(self, *replies):
        from websockets.asyncio.server import serve

        self.replies, self.ready = replies, threading.Event()
        self.loop = asyncio.new_event_loop()

        async def answer(websocket):
            k = 0
            async for _ in websocket:
                reply = self.replies[min(k, len(self.replies) - 1)]
                k += 1
                if reply is not None:
                    await websocket.send(reply)

        async def main():
            self.server = await serve(answer, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
            self.ready.set()
            await self.server.serve_forever()

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),), daemon=True)
        self.thread.start()
        self.ready.wait(30)

    def close(self):
        self.loop.call_soon_threadsafe(self.server.close)
        self.thread.join(30)


def _reply(observation=None, reward=0.0, done=False):
    observation = {"text": "a room", "won": False} if observation is None else observation
    return json.dumps({"type": "observation", "data": {"observation": observation, "reward": reward, "done": done}})


@pytest.mark.parametrize(("reply", "message"), [
    ("not json {", "JSONDecodeError"),
    (_reply(observation="a room"), "the observation is str, not an object"),
    (_reply(observation={"prompt": "a room"}), "no text field 'text'.*'prompt'"),
    (_reply(reward=math.nan), "the reward is nan"),
    (_reply(reward="1"), "the reward is '1'"),
    (_reply(done="yes"), "done is 'yes'"),
    (json.dumps({"type": "error", "data": {"message": "engine crashed", "code": "EXECUTION_ERROR"}}),
     "engine crashed"),
    (None, "no reply within message_timeout=2"),
], ids=["not-json", "not-an-object", "no-text", "nan-reward", "text-reward", "text-done", "error", "silent"])
def test_garbage_from_a_server_fails_the_call_with_a_clear_error(reply, message):
    fake = _GarbageServer(reply)
    try:
        remote = OpenEnvEnvironment(base_url=fake.url, message_timeout=2)
        with pytest.raises(OpenEnvError, match=f"OpenEnv server {re.escape(fake.url)}: reset failed .*{message}"):
            remote.reset({"seed": 0})
        remote.close()
    finally:
        fake.close()


def test_a_server_that_stops_answering_mid_episode_fails_the_step_after_message_timeout():
    fake = _GarbageServer(_reply(), None)
    try:
        remote = OpenEnvEnvironment(base_url=fake.url, message_timeout=5)
        assert remote.reset({"seed": 0}) == "a room"
        start = time.monotonic()
        with pytest.raises(OpenEnvError, match=r"step failed \(no reply within message_timeout=5"):
            remote.step("go south")
        assert time.monotonic() - start < 300  # bounded by the timeout, not by the server
        with pytest.raises(OpenEnvError, match="no open session"):
            remote.step("go south")  # the session was dropped: a late reply cannot be read as the next one
        remote.close()
    finally:
        fake.close()


def test_another_servers_field_names_and_a_json_observation():
    fake = _GarbageServer(_reply(observation={"prompt": "guess a word", "turn": 1}, reward=None))
    try:
        remote = OpenEnvEnvironment(base_url=fake.url, observation_field=None, won_field=None, task_field=None)
        assert json.loads(remote.reset({"seed": 0})) == {"prompt": "guess a word", "turn": 1}
        result = remote.step("crane")
        assert (result.reward, result.done, result.won) == (0.0, False, False)
        remote.close()
    finally:
        fake.close()


@pytest.mark.parametrize(("name", "value"), [("connect_timeout", 0), ("message_timeout", math.nan),
                                             ("base_url", 8000), ("task_field", 3)])
def test_bad_options_are_refused_naming_the_field(name, value):
    with pytest.raises(ValueError, match=rf"OpenEnvConfig\.{name}="):
        OpenEnvConfig(**{name: value})


def test_grpo_trains_on_a_served_textworld(server, tiny_chatml_model, tmp_path, textworld_train_tasks, local):
    from conftest import tiny_rl_args
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, reward_mode="dense")
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args,
                                   environment_factory=partial(OpenEnvEnvironment, base_url=server.url),
                                   train_dataset=Dataset.from_list(list(textworld_train_tasks)))
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    logged = [log for log in trainer.state.log_history if "episodes/success_rate" in log]
    assert len(logged) == 2 and all(log["episodes/failed"] == 0 for log in logged)
    episodes = trainer.last_rollout.episodes
    assert episodes and all(e.num_turns >= 1 for e in episodes)
    for episode in episodes:  # what the model saw came from the served games
        assert local.reset(episode.task) in episode.prompt_messages[-1]["content"]
