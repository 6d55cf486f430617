"""Dynamic sampling: a training step draws tasks until its groups have returns that differ (bounded by
`dynamic_sampling_max_draws`), counts what it drops, and can set aside tasks that keep tying; the selection rules
alone, the sampler with a scripted play, the episode source step-wise, and one GRPO training step."""

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from test_step_parts import OneProcess, scripted_backend, step_log
from toy_envs import TiesOnRequestEnv
from transformers import AutoTokenizer

from trl_multiturn import (
    MultiTurnGRPOConfig,
    MultiTurnGRPOTrainer,
    MultiTurnPPOConfig,
    MultiTurnRLOOConfig,
    MultiTurnRLOOTrainer,
)
from trl_multiturn.episode_data import load_episodes
from trl_multiturn.rollout import EpisodeRunner
from trl_multiturn.rollout.rules import EpisodeRules
from trl_multiturn.trainers.dynamic_sampling import (
    DynamicSampler,
    TaskShelf,
    draw_size,
    select_groups,
    task_key,
    tied_groups,
)
from trl_multiturn.trainers.episode_source import EpisodeSource

TASKS = [{"id": i, "ties": i < 6, "turns": 1} for i in range(8)]  # tasks 0-5 always tie, 6 and 7 never


def test_a_group_ties_when_its_valid_returns_are_equal_or_fewer_than_two():
    returns = [1.0, 1.0, 0.0, 1.0, None, 1.0, None, None, 0.5, 0.5]
    assert tied_groups(returns, 2) == [True, False, True, True, True]
    assert tied_groups([0.0, 0.0, 1.0], 3) == [False]


def test_a_draw_plays_what_the_tie_rate_says_is_missing_within_a_batch():
    assert draw_size(missing=2, played=4, kept=0, batch_groups=4) == 4  # nothing found yet: a whole batch
    assert draw_size(missing=1, played=4, kept=2, batch_groups=4) == 2  # half had signal: twice the missing
    assert draw_size(missing=3, played=12, kept=1, batch_groups=4) == 4  # capped at a batch
    assert draw_size(missing=2, played=2, kept=2, batch_groups=4) == 2  # never fewer than missing
    assert draw_size(missing=0, played=4, kept=4, batch_groups=4) == 1  # a satisfied process still plays one


def test_the_first_groups_with_signal_are_trained_and_tied_ones_fill_only_when_too_few():
    assert select_groups([True, False, True, False, False], 2) == ([1, 3], [0, 2, 4])
    assert select_groups([True, False, True, True], 3) == ([0, 1, 2], [3])  # the first tied ones fill
    assert select_groups([False, False], 2) == ([0, 1], [])


def test_a_task_that_ties_in_a_row_is_set_aside_for_its_steps():
    shelf = TaskShelf(steps=3, ties=2)
    assert not shelf.record("a", True, step=0) and not shelf.is_aside("a", 0)
    assert not shelf.record("a", False, step=1)  # signal resets the count
    assert not shelf.record("a", True, step=1)
    assert shelf.record("a", True, step=2) and shelf.is_aside("a", 2) and shelf.is_aside("a", 4)
    assert shelf.count(4) == 1 and not shelf.is_aside("a", 5) and shelf.count(5) == 0
    assert task_key({"id": 1, "x": [1]}) == task_key({"x": [1], "id": 1}) != task_key({"id": 2, "x": [1]})


def scripted_play(played):
    """A stand-in for the rollout: episode i of a group returns 0.5 on a tying task, else i (0 or 1)."""
    def play(rows):
        played.append([row["id"] for row in rows])
        return [SimpleNamespace(task=row, slot=i % 2) for i, row in enumerate(rows)]
    return play


def scripted_return(ep):
    return 0.5 if ep.task["ties"] else float(ep.slot)


def sampler(max_draws, shelf=None, any_rank=lambda flag: flag):
    return DynamicSampler(TASKS, 2, max_draws, shelf, seed=0, process_index=0, any_rank=any_rank)


def groups(rows):
    return [rows[i]["id"] for i in range(0, len(rows), 2)]


def test_draws_go_on_until_the_groups_have_signal_and_every_played_episode_is_trained_or_counted_dropped():
    played = []
    inputs = [TASKS[0]] * 2 + [TASKS[6]] * 2  # one tying task, one with signal
    draws = sampler(max_draws=20)(inputs, scripted_play(played), scripted_return, step=0)
    assert played[0] == [0, 0, 6, 6] and len(played) >= 2  # TRL's rows first, then draws from the dataset
    assert len(draws.rows) == 4 and all(not row["ties"] for row in draws.rows)
    assert groups(draws.rows)[0] == 6 and [ep.task for ep in draws.episodes] == draws.rows
    counts = draws.counts
    assert counts["groups_kept"] == 2 and counts["tied_groups_trained"] == 0 and counts["draws"] == len(played)
    assert counts["tied_groups"] >= 1 and counts["groups_played"] == sum(len(p) for p in played) / 2
    assert len(draws.episodes) + len(draws.dropped) == sum(len(p) for p in played)  # none lost
    assert counts["dropped_groups"] == len(draws.dropped) / 2 == counts["groups_played"] - 2


def test_the_bound_on_draws_stops_a_step_that_finds_too_few_and_tied_groups_fill_it():
    played = []
    only_ties = DynamicSampler(TASKS[:6], 2, 3, None, seed=0, process_index=0, any_rank=lambda flag: flag)
    draws = only_ties([TASKS[0]] * 2 + [TASKS[1]] * 2, scripted_play(played), scripted_return, step=0)
    assert len(played) == 3 and draws.counts["draws"] == 3
    assert groups(draws.rows) == [0, 1] and draws.counts["groups_kept"] == 0  # the first tied groups played
    assert draws.counts["tied_groups_trained"] == 2 and draws.counts["tied_groups"] == draws.counts["groups_played"]


def test_a_process_that_lacks_nothing_plays_on_while_another_one_does():
    played = []
    others_lack = iter([True, False])
    draws = sampler(max_draws=5, any_rank=lambda flag: flag or next(others_lack))(
        [TASKS[6]] * 2 + [TASKS[7]] * 2, scripted_play(played), scripted_return, step=0)
    assert [len(p) for p in played] == [4, 2]  # one group more, while the other process still lacked some
    assert groups(draws.rows) == [6, 7] and draws.counts["dropped_groups"] == 1


def test_set_aside_tasks_are_replaced_in_trls_rows_and_skipped_by_draws_until_their_time_is_over():
    shelf = TaskShelf(steps=2, ties=1)
    run = sampler(max_draws=20, shelf=shelf)
    played = []
    first = run([TASKS[0]] * 2 + [TASKS[6]] * 2, scripted_play(played), scripted_return, step=0)
    aside = {task["id"] for task in TASKS if shelf.is_aside(task_key(task), 1)}
    assert 0 in aside and first.counts["newly_set_aside"] == len(aside) == first.counts["set_aside_tasks"]
    played.clear()
    second = run([TASKS[0]] * 2 + [TASKS[7]] * 2, scripted_play(played), scripted_return, step=1)
    assert second.counts["replaced_tasks"] == 1 and 0 not in played[0] and played[0][2:] == [7, 7]
    assert not aside & {i for p in played for i in p}  # no set-aside task was played at step 1
    assert not shelf.is_aside(task_key(TASKS[0]), 2)  # set aside at step 0 for 2 steps


def test_the_episode_source_trains_only_groups_with_signal_step_wise(tiny_chatml_model):
    """Step-wise, the kept groups' episodes become the step rows; the dropped ones are counted."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    replies = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in ("aab", "abc")]

    def scripted(contexts):  # the two episodes of a group reply differently
        return [list(replies[i % 2]) for i in range(len(contexts))], None

    rules = EpisodeRules(max_turns=2, episode_format="stepwise",
                         action_parser="trl_multiturn.rollout.parsing:whole_reply")
    generation = scripted_backend(scripted, SimpleNamespace(max_new_tokens=8), pad_token_id=tokenizer.pad_token_id)
    runner = EpisodeRunner(TiesOnRequestEnv, tokenizer, generation, rules, eos_token_ids=[tokenizer.eos_token_id],
                           env_mode="inline")
    args = SimpleNamespace(save_episodes=False, reward_mode="dense", success_reward=1.0, format_penalty=0.0,
                           steps_per_batch=None, steps_per_generation=1, seed=0, mask_truncated_completions=False,
                           max_policy_lag=0)
    tasks = [{**task, "turns": 2} for task in TASKS]
    log = step_log()
    source = EpisodeSource(runner, args, OneProcess(), generation=generation, lagged=None, training=lambda: True,
                           state=lambda: SimpleNamespace(global_step=0), reward_weights=torch.tensor([1.0]),
                           num_generations=2, num_generations_eval=2, log=log,
                           dynamic=DynamicSampler(tasks, 2, 20, None, seed=0, process_index=0,
                                                  any_rank=lambda flag: flag))
    try:
        rows, batch = source([tasks[0]] * 2 + [tasks[6]] * 2)
    finally:
        runner.close()
    assert batch.steps is not None and len(rows) == len(batch.steps) == 8  # 4 episodes x 2 turns
    assert all(not ep.task["ties"] for ep in batch.episodes) and all(not row["ties"] for row in rows)
    returns = [row["episode_return"] for row in rows]
    assert returns[0] != returns[2]  # episode 0's two steps, then episode 1's: a group with signal
    metrics = log.metrics["train"]
    assert metrics["dynamic_sampling/groups_kept"] == [2.0] and metrics["dynamic_sampling/draws"][0] >= 2
    assert 0 < metrics["dynamic_sampling/tied_fraction"][0] < 1 and metrics["dynamic_sampling/dropped_groups"][0] >= 1
    # of each group played with signal, the episode replying "abc" wins: the rate is over every episode played
    assert metrics["dynamic_sampling/played_success_rate"] == [pytest.approx(
        (1 - metrics["dynamic_sampling/tied_fraction"][0]) / 2)] and sum(ep.won for ep in batch.episodes) == 2


@pytest.mark.parametrize(("config_cls", "trainer_cls"), [(MultiTurnGRPOConfig, MultiTurnGRPOTrainer),
                                                         (MultiTurnRLOOConfig, MultiTurnRLOOTrainer)])
def test_a_training_step_trains_only_groups_whose_returns_differ_and_logs_its_draws(config_cls, trainer_cls,
                                                                                    tiny_chatml_model, tmp_path):
    """Without dynamic sampling this seed's first batch holds two tying tasks (zero_advantage_groups 1.0)."""
    args = tiny_rl_args(config_cls, tmp_path, max_steps=1, max_turns=1, env_mode="inline",
                        dynamic_sampling=True, dynamic_sampling_max_draws=16, reward_mode="dense",
                        save_episodes=True)
    trainer = trainer_cls(tiny_chatml_model, args=args, environment_factory=TiesOnRequestEnv,
                          train_dataset=Dataset.from_list(TASKS))
    trainer.train()
    batch = trainer.last_rollout
    assert len(batch.episodes) == 4 and all(not ep.task["ties"] for ep in batch.episodes)
    returns = [trainer.step.episodes.episode_return(ep) for ep in batch.episodes]
    assert returns[0] != returns[1] and returns[2] != returns[3]  # each group trained has signal
    logged = next(entry for entry in trainer.state.log_history if "dynamic_sampling/draws" in entry)
    assert logged["dynamic_sampling/groups_kept"] == 2 and logged["dynamic_sampling/tied_groups_trained"] == 0
    assert logged["credit/zero_advantage_groups"] == 0
    assert 0 < logged["dynamic_sampling/tied_fraction"] < 1  # ties were played, and dropped
    assert logged["dynamic_sampling/dropped_groups"] > 0 and logged["dynamic_sampling/draws"] >= 2
    dropped = load_episodes(tmp_path, "train-step-0-rank0-dropped.parquet")  # played, not trained: saved apart
    assert len(dropped) == 2 * logged["dynamic_sampling/dropped_groups"]
    assert len(load_episodes(tmp_path, "train-step-0-rank0.parquet")) == 4


@pytest.mark.parametrize(("config_cls", "overrides", "message"), [
    (MultiTurnGRPOConfig, {"dynamic_sampling_max_draws": 0}, "dynamic_sampling_max_draws=0"),
    (MultiTurnGRPOConfig, {"dynamic_sampling_set_aside_steps": -1}, "dynamic_sampling_set_aside_steps=-1"),
    (MultiTurnGRPOConfig, {"dynamic_sampling_set_aside_ties": 0}, "dynamic_sampling_set_aside_ties=0"),
    (MultiTurnGRPOConfig, {"dynamic_sampling": True, "max_policy_lag": 1}, "set max_policy_lag=0"),
    (MultiTurnPPOConfig, {"dynamic_sampling": True, "num_generations": 1}, "dynamic_sampling=True"),
])
def test_bad_dynamic_sampling_settings_are_refused_when_the_config_is_built(config_cls, overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace("(", r"\(")):
        tiny_rl_args(config_cls, tmp_path, **overrides)


@pytest.mark.parametrize("config_cls", [MultiTurnGRPOConfig, MultiTurnRLOOConfig])
def test_a_process_whose_rows_split_a_group_is_refused(config_cls, tmp_path):
    """On one process TRL already refuses a generation batch of partial groups; on several, a process's share can
    still split one (e.g. one row each of a group of two on two processes)."""
    args = tiny_rl_args(config_cls, tmp_path, dynamic_sampling=True)
    args.per_device_train_batch_size, args.steps_per_generation = 1, 1  # as a process of two would hold
    with pytest.raises(ValueError, match=r"per_device_train_batch_size \* steps_per_generation = 1 is not a "
                                         r"multiple of num_generations=2"):
        args.check_multiturn_args()
