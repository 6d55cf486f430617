"""`overlap`: two halves of a rollout take turns, one half's environment steps running while the other generates."""

import functools
import threading
import time
from pathlib import Path

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


class TimedCountingEnv(CountingEnv):
    """`CountingEnv` whose steps sleep a little and report when they ran (wall-clock stamps, comparable across the
    worker processes)."""

    def step(self, action):
        start = time.time()
        time.sleep(0.05)
        result = super().step(action)
        return StepResult(result.observation, result.reward, result.done, result.won,
                          {"start": start, "end": time.time()})


class CallGatedEnv(CountingEnv):
    """`CountingEnv` whose step of half `task["half"]` (0: the runner's first half of the rows, 1: the second) at turn
    t does not return before `2 t + half` generate calls have started (the runner counts them in the file `gate`):
    under overlap that is the other half's call made while this step runs, so the step overlaps it whatever the
    machine's load. The second half's last step waits for nothing (no call is due after it). A runner that did not
    overlap would leave a step waiting for a call that never comes, until `patience` seconds (then the test fails).
    Steps report when they ran, as `TimedCountingEnv`'s do."""

    def __init__(self, gate, patience=120.0):
        super().__init__()
        self.gate, self.patience = Path(gate), patience

    def reset(self, task):
        self.half = task["half"]
        return super().reset(task)

    def step(self, action):
        start = time.time()
        result = super().step(action)
        due = 2 * self.turn + self.half
        if not (self.half and result.done):
            waited = time.monotonic()
            while int(self.gate.read_text() or 0) < due and time.monotonic() - waited < self.patience:
                time.sleep(0.005)
        return StepResult(result.observation, result.reward, result.done, result.won,
                          {"start": start, "end": time.time()})


# `from_pretrained(dtype=...)` sets torch's process-wide default dtype while it loads: two threads loading at once
# (the two-rank test) can leave it float64 for the other thread's model and for later tests.
_LOADING = threading.Lock()


def play(path, rows, overlap, generator="per_context", env=CountingEnv, any_live=None, gate=None,
         max_episode_tokens=None, **kwargs):
    """Episodes and the (start, end, number of contexts) of each generate call; with `gate` (a file), the number of
    calls started so far is written there as each call starts."""
    with _LOADING:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(path)
    generate = (hf_generate_fn(model, tokenizer, batch_size=1) if generator == "per_context"
                else CachedGenerator(model, tokenizer, streams=2))
    calls = []

    def timed(contexts, max_new_tokens):
        start = time.time()
        if gate is not None:
            gate.write_text(str(len(calls) + 1))  # calls holds the finished ones: this one is the next
        out = generate(contexts, max_new_tokens)
        calls.append((start, time.time(), len(contexts)))
        return out

    rules = EpisodeRules(max_turns=4, max_completion_length=6, max_episode_tokens=max_episode_tokens,
                         action_parser=lambda reply: "go")
    runner = EpisodeRunner(env, tokenizer, timed, rules, overlap=overlap, any_live=any_live, **kwargs)
    try:
        return model, tokenizer, runner(rows), calls
    finally:
        runner.close()


@pytest.mark.parametrize("generator", ["per_context", "cached"])
def test_overlap_plays_the_same_greedy_episodes_in_half_batches(tiny_model, generator):
    _, _, reference, ref_calls = play(tiny_model, ROWS, overlap=False, generator=generator, max_episode_tokens=120)
    model, tokenizer, episodes, calls = play(tiny_model, ROWS, overlap=True, generator=generator,
                                             max_episode_tokens=120)
    assert all(same_episode(ep, ref) for ep, ref in zip(episodes, reference))
    for ep in episodes:
        assert_token_exact(model, ep)
        assert_env_mask_exact(tokenizer, ep)
    assert max(n for _, _, n in calls) <= 3 < max(n for _, _, n in ref_calls)  # halves of 5: 3 and 2
    assert sum(n for _, _, n in calls) == sum(n for _, _, n in ref_calls) == sum(ep.num_turns for ep in episodes)


def overlapping_calls(episodes, calls):
    """Generate calls that ran while some environment step was running."""
    steps = [(info["start"], info["end"]) for ep in episodes for info in ep.infos]
    return [c for c in calls if any(s < c[1] and c[0] < e for s, e in steps)]


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_steps_run_while_the_other_half_generates(tiny_chatml_model, mode, tmp_path):
    gate = tmp_path / "calls"
    gate.write_text("0")
    rows = [{"target": 4, "half": 0}] * 2 + [{"target": 4, "half": 1}] * 2
    episodes, calls = play(tiny_chatml_model, rows, overlap=True, env=functools.partial(CallGatedEnv, gate),
                           env_mode=mode, gate=gate)[2:]
    assert all(ep.won and ep.num_turns == 4 for ep in episodes)
    # Each half's 4 turns are one call each; every one but the first starts while the other half's steps run.
    replies = [c for c in calls if c[2]]
    assert len(replies) == 8 and len(overlapping_calls(episodes, replies)) == 7
    episodes, calls = play(tiny_chatml_model, rows, overlap=False, env=TimedCountingEnv, env_mode=mode)[2:]
    assert overlapping_calls(episodes, calls) == []


def test_ranks_whose_episodes_end_at_different_turns_make_equal_generate_calls(tiny_chatml_model):
    """Two runners in two threads stand for two ranks; `any_live` sums their live counts at a barrier, as the
    trainers' cross-rank reduction does."""
    barrier, counts, lock = threading.Barrier(2), [0, 0], threading.Lock()
    calls, played = {}, {}

    def any_live(rank):
        def reduce(local):
            with lock:
                counts[rank] = local
            barrier.wait()
            total = sum(counts)
            barrier.wait()  # both have read the total before either writes the next count
            return total > 0
        return reduce

    def rank_main(rank, rows):
        played[rank], calls[rank] = play(tiny_chatml_model, rows, overlap=True, any_live=any_live(rank))[2:]

    threads = [threading.Thread(target=rank_main, args=(0, [{"target": 1}] * 3)),
               threading.Thread(target=rank_main, args=(1, [{"target": 4}] * 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [n for _, _, n in calls[1]] == [2, 1] * 4 + [0]
    assert [n for _, _, n in calls[0]] == [2, 1] + [0] * 7
    assert [ep.num_turns for ep in played[0]] == [1] * 3 and [ep.num_turns for ep in played[1]] == [4] * 3


def test_a_trainer_with_rollout_overlap_plays_the_same_greedy_episodes(tiny_chatml_model, tmp_path):
    """top_k=1 makes the trainer's sampling greedy; its history cache then keeps one cache per half."""
    from conftest import tiny_rl_args
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

    rows = [{"target": 3}, {"target": 1}, {"target": 2}, {"target": 3}]
    played = {}
    for overlap in (False, True):
        args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path / str(overlap), top_k=1, rollout_overlap=overlap)
        with MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                  train_dataset=Dataset.from_list(rows)) as trainer:
            cache = trainer.generation.history_cache
            assert trainer.episode_runner.overlap == overlap and cache.streams == 1 + overlap
            trainer.model.eval()
            _, batch = trainer.step.episodes(rows)
            played[overlap] = batch.episodes
    assert all(same_episode(ep, ref) for ep, ref in zip(played[True], played[False]))
    assert [ep.num_turns for ep in played[True]] == [3, 1, 2, 3]
