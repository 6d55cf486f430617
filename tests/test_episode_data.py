"""Episodes as data: an evaluation's or a training step's episodes as a `datasets.Dataset`, and rejection-sampling
SFT on the won ones."""

import math

import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnSFTConfig, MultiTurnSFTTrainer
from trl_multiturn.episode_data import EPISODES_DIR, load_episodes
from trl_multiturn.evaluation import evaluate
from trl_multiturn.rollout.rules import EpisodeRules

TASKS = [{"target": 1}, {"target": 2}, {"target": 3}, {"target": 1}]


def test_an_evaluations_episodes_become_rows_that_say_how_each_went(tiny_chatml_model):
    result = evaluate(tiny_chatml_model, CountingEnv, TASKS, progress=False,
                      rules=EpisodeRules(max_turns=3, max_completion_length=6, action_parser="whole_reply"))
    data = result.to_dataset()
    assert len(data) == len(TASKS) == len(result.episodes)
    for row, ep in zip(data, result.episodes):
        assert row["turn_rewards"] == ep.turn_rewards and row["return"] == sum(ep.turn_rewards)
        assert row["won"] == ep.won and row["num_turns"] == ep.num_turns and row["actions"] == ep.actions
        assert row["messages"][-1] == {"role": "assistant", "content": ep.replies[-1]}
        assert [m["content"] for m in row["messages"] if m["role"] == "assistant"] == ep.replies
        assert row["prompt_ids"] + row["completion_ids"] == ep.prompt_ids + ep.completion_ids
        assert row["env_mask"] == ep.env_mask
        # The observation that answered the last reply is kept apart, so that `messages` ends on a reply.
        assert row["final_observation"] == (ep.observations[-1] if len(ep.observations) == ep.num_turns else None)
    # CountingEnv pays k on turn k: a won 2-turn episode's rewards are [1, 2].
    assert any(row["won"] and row["turn_rewards"] == [1.0, 2.0] for row in data)


def test_rejection_sampling_sft_trains_on_the_won_episodes(tiny_chatml_model, tmp_path):
    result = evaluate(tiny_chatml_model, CountingEnv, TASKS, progress=False,
                      rules=EpisodeRules(max_turns=3, max_completion_length=6, action_parser="whole_reply"))
    won = result.to_dataset().filter(lambda row: row["won"])
    assert 0 < len(won) <= len(TASKS)
    args = MultiTurnSFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2,
                              use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1,
                              learning_rate=1e-2, max_length=None)
    trainer = MultiTurnSFTTrainer(tiny_chatml_model, args=args, train_dataset=won)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    out = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(out.training_loss)
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters()))
    # SFT re-tokenized the won replies: every trained token is one of a won reply's (or its end-of-turn token).
    row = trainer.train_dataset[0]
    trained = [t for t in row["labels"] if t != -100]
    replies = [m["content"] for m in won[0]["messages"] if m["role"] == "assistant"]
    assert trainer.processing_class.decode(trained, skip_special_tokens=True) == "".join(replies)


def test_save_episodes_writes_each_training_steps_episodes(tiny_chatml_model, tmp_path):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, save_episodes=True, max_steps=2)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                   train_dataset=Dataset.from_list(TASKS))
    trainer.train()
    files = sorted(p.name for p in (tmp_path / EPISODES_DIR).iterdir())
    assert files == ["train-step-0-rank0.parquet", "train-step-1-rank0.parquet"]
    step = load_episodes(tmp_path, "train-step-1*")
    assert len(step) == args.per_device_train_batch_size
    logged = [log for log in trainer.state.log_history if "episodes/success_rate" in log]
    assert sum(step["won"]) / len(step) == logged[1]["episodes/success_rate"]
    assert len(load_episodes(tmp_path)) == 2 * args.per_device_train_batch_size


def test_no_episodes_are_saved_by_default(tiny_chatml_model, tmp_path):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_steps=1)
    MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                         train_dataset=Dataset.from_list(TASKS)).train()
    assert not (tmp_path / EPISODES_DIR).exists()
