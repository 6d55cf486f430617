"""The per-token reverse-KL reward of on-policy distillation (`credit/distillation.py`), on hand-made tensors."""

import math

import pytest
import torch

from trl_multiturn.credit.distillation import reverse_kl_rewards, teacher_reward_share


def test_reverse_kl_rewards_by_hand():
    # Two rows of four completion columns. Row 0: sampled, observation, sampled, padding; row 1: all sampled but the
    # last (padding). The masked positions hold values (even non-finite ones) that must not leak into the reward.
    student = torch.tensor([[-1.0, -0.2, -2.0, 0.0], [-0.5, -0.5, -3.0, math.nan]])
    teacher = torch.tensor([[-1.5, -9.0, -1.0, math.inf], [-0.5, -2.5, -1.0, 0.0]])
    trained = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 0]])
    rewards = reverse_kl_rewards(student, teacher, trained, coef=2.0)
    # r = -2 * (student - teacher) on trained tokens:
    # row 0: -2 * (-1 + 1.5) = -1.0;  observation 0;  -2 * (-2 + 1) = 2.0;  padding 0
    # row 1: -2 * (-0.5 + 0.5) = 0.0 (teacher agrees);  -2 * (-0.5 + 2.5) = -4.0;  -2 * (-3 + 1) = 4.0;  padding 0
    assert rewards.tolist() == [[-1.0, 0.0, 2.0, 0.0], [0.0, -4.0, 4.0, 0.0]]
    # the student as its own teacher: no reward anywhere
    assert torch.equal(reverse_kl_rewards(student, student, trained, coef=1.0).abs(), torch.zeros_like(student))


def test_a_negative_weight_is_refused():
    with pytest.raises(ValueError, match="coef=-1"):
        reverse_kl_rewards(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), coef=-1.0)


def test_the_teacher_reward_share_by_hand():
    assert teacher_reward_share(1.0, 3.0) == 0.25  # |teacher| 1 of a total magnitude 4
    assert teacher_reward_share(2.0, 0.0) == 1.0  # nothing else rewards
    assert teacher_reward_share(0.0, 5.0) == 0.0  # the student as its own teacher
    assert teacher_reward_share(0.0, 0.0) == 0.0
