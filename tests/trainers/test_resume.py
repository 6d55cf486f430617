"""Exact resume: a run interrupted at a checkpoint and resumed by a fresh trainer trains the same steps as the run
that was never interrupted (same sampled replies, same returns, same final parameters).

The interrupted run is stopped at step 2 by a callback rather than trained with `max_steps=2`: the learning-rate
schedule is built over `max_steps`, so a run trained to 2 steps and resumed to 3 decays its rate to 0 by step 2 and
cannot match a 3-step run, whatever the trainer restores."""

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import ReplyScoringEnv
from transformers import AutoModelForCausalLM, TrainerCallback

from trl_multiturn import (
    MultiTurnGRPOConfig,
    MultiTurnGRPOTrainer,
    MultiTurnPPOConfig,
    MultiTurnPPOTrainer,
    MultiTurnRLOOConfig,
    MultiTurnRLOOTrainer,
)

TRAINERS = {
    "grpo": (MultiTurnGRPOConfig, MultiTurnGRPOTrainer, {}),
    "rloo": (MultiTurnRLOOConfig, MultiTurnRLOOTrainer, {}),
    "ppo": (MultiTurnPPOConfig, MultiTurnPPOTrainer, {"num_generations": 1}),
    "grpo-overlap": (MultiTurnGRPOConfig, MultiTurnGRPOTrainer, {"rollout_overlap": True}),
}
ROWS = [{"turns": 2, "id": i} for i in range(8)]  # 8 rows, 4 a step: the resumed step 3 opens the second epoch


class StopAt(TrainerCallback):
    """Ends training after `step` (its checkpoint saved), as an interruption would: the schedule stays max_steps'."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def train(kind, model, output_dir, stop_at=None, resume=None):
    config_cls, trainer_cls, extra = TRAINERS[kind]
    args = tiny_rl_args(config_cls, output_dir, max_steps=3, save_strategy="steps", save_steps=2,
                        reward_mode="dense", action_parser="trl_multiturn.rollout.parsing:whole_reply",
                        max_completion_length=6, **extra)
    trainer = trainer_cls(model, args=args, environment_factory=ReplyScoringEnv,
                          train_dataset=Dataset.from_list(ROWS),
                          callbacks=[StopAt(stop_at)] if stop_at else None)
    trainer.train(resume_from_checkpoint=resume)
    returns = {log["step"]: log["episodes/mean_return"] for log in trainer.state.log_history
               if "episodes/mean_return" in log}
    return returns, [p.detach().clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_a_resumed_run_matches_the_uninterrupted_one(kind, tiny_chatml_model, tmp_path):
    returns, params = train(kind, tiny_chatml_model, tmp_path / "whole")
    train(kind, tiny_chatml_model, tmp_path / "cut", stop_at=2)
    resumed_returns, resumed_params = train(kind, tiny_chatml_model, tmp_path / "cut",
                                            resume=str(tmp_path / "cut" / "checkpoint-2"))
    assert sorted(returns) == [1, 2, 3] and len(set(returns.values())) > 1  # the returns do vary with the reply
    assert resumed_returns[3] == returns[3]
    initial = AutoModelForCausalLM.from_pretrained(tiny_chatml_model).parameters()
    assert any(not torch.equal(a, b) for a, b in zip(params, initial))  # training moved the model
    assert all(torch.equal(a, b) for a, b in zip(params, resumed_params))
