"""`RolloutBatch`: one step's data handed from the rollout to the credit and the loss, with no per-step state left
on the trainer between TRL's calls."""

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnRLOOConfig, MultiTurnRLOOTrainer
from trl_multiturn.rollout import Episode
from trl_multiturn.rollout.episode import Status
from trl_multiturn.trainers.batch import RolloutBatch


def _episode(**fields) -> Episode:
    return Episode(task={}, prompt_ids=[5, 6], prompt_messages=[{"role": "user", "content": "go"}],
                   completion_ids=[7, 8, 9], env_mask=[1, 0, 1], logprobs=[-0.1, 0.0, -0.2], **fields)


def test_token_lists_give_failed_and_empty_episodes_one_masked_token():
    empty = Episode(task={}, prompt_ids=[5], prompt_messages=[])
    batch = RolloutBatch([_episode(), _episode(status=Status.FAILED), empty], [[1.0], [0.0], []], torch.ones(1),
                         num_generations=3)
    lists = batch.token_lists(pad_id=0, eos_id=2)
    assert lists[0] == ([5, 6], [7, 8, 9], [1, 0, 1], [-0.1, 0.0, -0.2])
    assert [lst[:3] for lst in lists[1:]] == [([0], [2], [0])] * 2


def test_trained_mask_drops_truncated_episodes_only_when_asked():
    batch = RolloutBatch([_episode(), _episode(status=Status.TRUNCATED)], [[1.0], [1.0]], torch.ones(1),
                         num_generations=2)
    masks = [[1, 0, 1], [1, 0, 1]]
    assert batch.trained_mask(masks, mask_truncated=False) == masks
    assert batch.trained_mask(masks, mask_truncated=True) == [[1, 0, 1], [0, 0, 0]]


def test_scores_are_recorded_on_a_new_batch_and_sliced_per_rank():
    batch = RolloutBatch([_episode(), _episode()], [[1.0], [2.0]], torch.ones(2), num_generations=2,
                         process_index=1)
    scores = torch.arange(8.0).reshape(4, 2)  # gathered over two ranks of two episodes
    scored = batch.with_scores(scores)
    assert batch.rewards_per_func is None and batch.local_scores() is None
    assert torch.equal(scored.local_scores(), scores[2:4])


def _step_trainer(trainer_cls, config_cls, model, tmp_path, **overrides):
    def turns(completions, **kwargs):  # a trajectory reward: the number of messages after the prompt
        return [float(len(c)) for c in completions]

    args = tiny_rl_args(config_cls, tmp_path, reward_mode="dense", reward_weights=[1.0, 0.5],
                        action_parser="trl_multiturn.rollout.parsing:whole_reply", **overrides)
    trainer = trainer_cls(model=model, args=args, environment_factory=CountingEnv, reward_funcs=[turns],
                          train_dataset=Dataset.from_list([{"target": 2}] * 4))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@pytest.mark.parametrize("trainer_cls,config_cls,overrides", [
    (MultiTurnGRPOTrainer, MultiTurnGRPOConfig, {}),
    (MultiTurnRLOOTrainer, MultiTurnRLOOConfig, {"loss_granularity": "turn", "beta": 0.0}),  # no KL penalty
])
def test_a_step_hands_its_batch_to_the_credit_and_leaves_no_state_between_calls(
        trainer_cls, config_cls, overrides, tiny_chatml_model, tmp_path):
    trainer = _step_trainer(trainer_cls, config_cls, tiny_chatml_model, tmp_path, **overrides)
    torch.manual_seed(0)
    output = trainer._generate_and_score_completions([{"target": 1}, {"target": 3}] * 2)  # groups: (1, 3), (1, 3)
    batch = trainer.last_rollout
    # The scores of both reward sources reached the batch, and the credit computed from the batch alone gives
    # exactly the advantages the loss was handed.
    assert batch.rewards_per_func.shape == (4, 2) and batch.mode == "train" and batch.num_generations == 2
    assert [ep.task["target"] for ep in batch.episodes] == [1, 3, 1, 3]
    assert torch.equal(trainer.step.credit.token_advantages(batch, output["completion_ids"].shape[1]).to(
        output["advantages"].device), output["advantages"])
    assert output["advantages"].abs().sum() > 0
    # Nothing of the step stays on the trainer for the next TRL call to read.
    assert not any(hasattr(trainer, name) for name in ("_episodes", "_last_rewards_per_func", "_batch_in_trl_call"))
