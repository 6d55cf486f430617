"""`schedule="episode"`: an episode goes back to generation as soon as its environment answers, without waiting
for the slowest episode of its turn; it plays the same episodes as lockstep."""

import threading
import time

import pytest
import torch
from rollout_checks import assert_env_mask_exact, assert_token_exact, same_episode
from toy_envs import CountingEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn import StepResult
from trl_multiturn.rollout import EpisodeRunner
from trl_multiturn.rollout.generation import CachedGenerator, hf_generate_fn
from trl_multiturn.rollout.rules import EpisodeRules

ROWS = [{"target": 3}, {"target": 1}, {"target": 5}, {"target": 2}, {"target": 4}]

# Set by the generate function of `test_fast_episodes_take_turns_while_a_slow_step_runs`: the gated episode's first
# step waits for it (the environments run as threads of this process).
GATE = threading.Event()
GATE_WAIT_S = 120.0  # only so that a broken scheduler fails instead of hanging; never reached when it works


class DelayedCountingEnv(CountingEnv):
    """`CountingEnv` whose steps sleep `target` x 10 ms: the episodes' steps return in another order than the
    rollout started them."""

    def step(self, action):
        time.sleep(0.01 * self.target)
        return super().step(action)


class EventGatedEnv(CountingEnv):
    """`CountingEnv` in threads; the first step of a task with "gate" waits until `GATE` is set and reports it."""

    execution = "thread"

    def reset(self, task):
        self.gated = bool(task.get("gate"))
        return super().reset(task)

    def step(self, action):
        opened = GATE.wait(GATE_WAIT_S) if self.gated and self.turn == 0 else None
        result = super().step(action)
        return StepResult(result.observation, result.reward, result.done, result.won, {"gate_opened": opened})


class MidEpisodeFaultEnv(CountingEnv):
    """`CountingEnv` whose second step raises or hangs when the task says so."""

    def reset(self, task):
        self.fault = task.get("fault")
        return super().reset(task)

    def step(self, action):
        if self.turn == 1 and self.fault == "raise":
            raise RuntimeError("engine crashed mid-episode")
        if self.turn == 1 and self.fault == "hang":
            time.sleep(60)
        return super().step(action)


def play(path, rows, schedule, generator="per_context", env=CountingEnv, on_call=None, **kwargs):
    """The episodes and the number of contexts of each generate call."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(path)
    generate = (hf_generate_fn(model, tokenizer, batch_size=1) if generator == "per_context"
                else CachedGenerator(model, tokenizer))
    calls = []

    def counted(contexts, max_new_tokens):
        calls.append(len(contexts))
        if on_call is not None:
            on_call(len(calls), [tokenizer.decode(c) for c in contexts])
        return generate(contexts, max_new_tokens)

    rules = EpisodeRules(max_turns=5, max_completion_length=6, action_parser=lambda reply: "go")
    runner = EpisodeRunner(env, tokenizer, counted, rules, schedule=schedule, **kwargs)
    try:
        return model, tokenizer, runner(rows), calls
    finally:
        runner.close()


@pytest.mark.parametrize("generator", ["per_context", "cached"])
def test_episode_scheduling_plays_the_same_greedy_episodes_as_lockstep(tiny_model, generator):
    _, _, reference, ref_calls = play(tiny_model, ROWS, "turn", generator, DelayedCountingEnv)
    model, tokenizer, episodes, calls = play(tiny_model, ROWS, "episode", generator, DelayedCountingEnv)
    assert all(same_episode(ep, ref) for ep, ref in zip(episodes, reference))
    assert [ep.num_turns for ep in episodes] == [3, 1, 5, 2, 4] and all(ep.won for ep in episodes)
    for ep in episodes:
        assert_token_exact(model, ep)
        assert_env_mask_exact(tokenizer, ep)
    assert ref_calls == [5, 4, 3, 2, 1]  # lockstep: one call per turn for every live episode
    assert sum(calls) == sum(ref_calls) == sum(ep.num_turns for ep in episodes)


def test_fast_episodes_take_turns_while_a_slow_step_runs(tiny_chatml_model):
    """The gated episode's first step returns only once the third generate call has started: the other episodes'
    next replies are generated while it runs. Lockstep would wait for it at the first turn (and never make a second
    call), so the reference is played with the gate open."""
    rows = [{"target": 2, "gate": True}, {"target": 4}, {"target": 3}]
    GATE.set()
    try:
        _, _, reference, ref_calls = play(tiny_chatml_model, rows, "turn", env=EventGatedEnv)
    finally:
        GATE.clear()
    gated_in_call = []

    def on_call(n, contexts):
        gated_in_call.append(any("Count to 2." in c for c in contexts))
        if n == 3:
            GATE.set()

    _, _, episodes, calls = play(tiny_chatml_model, rows, "episode", env=EventGatedEnv, on_call=on_call)
    assert episodes[0].infos[0]["gate_opened"] is True
    assert gated_in_call[:3] == [True, False, False]  # the second and third calls went on without it
    assert True in gated_in_call[3:]  # its second reply
    assert ref_calls == [3, 3, 2, 1]
    assert all(same_episode(ep, ref) for ep, ref in zip(episodes, reference))
    assert [ep.num_turns for ep in episodes] == [2, 4, 3]


@pytest.mark.parametrize("fault,mode", [("raise", "process"), ("hang", "process"), ("hang", "thread")])
def test_a_fault_mid_episode_fails_only_its_episode(tiny_chatml_model, fault, mode):
    rows = [{"target": 3}, {"target": 4, "fault": fault}, {"target": 2}]
    timeout = 2.0 if fault == "hang" else None
    _, _, reference, _ = play(tiny_chatml_model, rows, "turn", env=MidEpisodeFaultEnv, env_mode=mode,
                              env_timeout=timeout)
    _, _, episodes, _ = play(tiny_chatml_model, rows, "episode", env=MidEpisodeFaultEnv, env_mode=mode,
                             env_timeout=timeout)
    assert [ep.failed for ep in episodes] == [False, True, False]
    assert ("raised RuntimeError" if fault == "raise" else "timed out") in episodes[1].failure
    assert episodes[1].num_turns == 2 and episodes[1].turn_rewards == [1.0, 0.0]
    assert [ep.won for ep in episodes] == [True, False, True]
    assert all(same_episode(ep, ref) for ep, ref in zip(episodes, reference))


def test_a_schedule_that_does_not_exist_or_overlap_with_episode_scheduling_is_refused(tiny_chatml_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    with pytest.raises(ValueError, match=r"rollout_schedule='lockstep': choose one of \('turn', 'episode'\)"):
        EpisodeRunner(CountingEnv, tokenizer, None, EpisodeRules(max_turns=2), schedule="lockstep")
    with pytest.raises(ValueError, match="rollout_overlap=True: choose one"):
        EpisodeRunner(CountingEnv, tokenizer, None, EpisodeRules(max_turns=2), schedule="episode", overlap=True)


def test_the_config_refuses_an_unknown_schedule_and_episode_scheduling_with_overlap(tmp_path):
    from conftest import tiny_rl_args

    from trl_multiturn import MultiTurnGRPOConfig

    with pytest.raises(ValueError, match=r"rollout_schedule='lockstep': give one of \('turn', 'episode'\)"):
        tiny_rl_args(MultiTurnGRPOConfig, tmp_path, rollout_schedule="lockstep")
    with pytest.raises(ValueError, match="set rollout_overlap=False"):
        tiny_rl_args(MultiTurnGRPOConfig, tmp_path, rollout_schedule="episode", rollout_overlap=True)


def test_a_trainer_with_episode_scheduling_plays_the_same_greedy_episodes(tiny_chatml_model, tmp_path):
    """top_k=1 makes the trainer's sampling greedy (through its episode-history cache)."""
    from conftest import tiny_rl_args
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

    rows = [{"target": 3}, {"target": 1}, {"target": 2}, {"target": 3}]
    played = {}
    for schedule in ("turn", "episode"):
        args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path / schedule, top_k=1, rollout_schedule=schedule)
        with MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=DelayedCountingEnv,
                                  train_dataset=Dataset.from_list(rows)) as trainer:
            assert trainer.episode_runner.schedule == schedule
            trainer.model.eval()
            _, batch = trainer.step.episodes(rows)
            played[schedule] = batch.episodes
    assert all(same_episode(ep, ref) for ep, ref in zip(played["episode"], played["turn"]))
    assert [ep.num_turns for ep in played["episode"]] == [3, 1, 2, 3]
