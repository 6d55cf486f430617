"""Importance weights (`trainers/importance.py`): every mode by hand, DESIGN invariant 19 (an episode's weight does
not depend on its length when its per-token ratios do not) for the default and every length-neutral mode, TRL's
sequence modes shown to break it, the logged statistics, the config's default and its refusals."""

import dataclasses
import math

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_envs import CountingEnv

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnPPOConfig
from trl_multiturn.trainers.importance import (
    IMPORTANCE_SAMPLING_MODES,
    LENGTH_NEUTRAL_MODES,
    importance_weights,
    turn_ids,
    weight_statistics,
)


def rows_with_ratio(log_ratio: float, lengths: list[int], turns: int = 1):
    """Current and behaviour log-probs of rows of `lengths` trained tokens, every token's log-ratio `log_ratio`,
    right-padded; and each row's turn index, its tokens split into `turns` equal turns."""
    width = max(lengths)
    behaviour = torch.full((len(lengths), width), -2.0)
    current = behaviour + log_ratio
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    spans = [[(k * n // turns, (k + 1) * n // turns) for k in range(turns)] for n in lengths]
    return current, behaviour, mask, turn_ids(spans, width)


def episode_weights(weights: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per row, the weights its trained tokens carry."""
    full = weights.expand_as(mask)
    return [full[i][mask[i].bool()] for i in range(mask.size(0))]


def spread(rows: list[torch.Tensor]) -> float:
    """The largest relative difference between any two weights of any rows (float32 sums: ~1e-6 when equal)."""
    values = torch.cat(rows)
    return ((values.max() - values.min()) / values.abs().max()).item()


def config(**overrides):
    return MultiTurnGRPOConfig(output_dir="/tmp/unused", report_to=[], **overrides)


def test_the_default_is_length_neutral_for_grpo_and_ppo():
    assert config().vllm_importance_sampling_mode == "token_truncate" in LENGTH_NEUTRAL_MODES
    assert MultiTurnPPOConfig(output_dir="/tmp/unused", report_to=[]).vllm_importance_sampling_mode == \
        "token_truncate"


@pytest.mark.parametrize("log_ratio", [math.log(1.01), math.log(0.98)])
def test_episodes_of_10_and_1000_tokens_with_equal_per_token_ratios_weigh_the_same_under_the_default(log_ratio):
    current, behaviour, mask, turns = rows_with_ratio(log_ratio, [10, 1000], turns=5)
    args = config()
    weights, _ = importance_weights(current, behaviour, mask, args.vllm_importance_sampling_mode,
                                    args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max,
                                    turns)
    assert spread(episode_weights(weights, mask)) < 1e-5
    assert weights[0, 0].item() == pytest.approx(math.exp(log_ratio), rel=1e-5)


@pytest.mark.parametrize("mode", LENGTH_NEUTRAL_MODES)
@settings(max_examples=40)
@given(log_ratio=st.floats(-0.05, 0.05), lengths=st.lists(st.integers(1, 1000), min_size=2, max_size=3),
       turns=st.integers(1, 4))
def test_every_length_neutral_mode_weighs_equal_per_token_ratios_equally(mode, log_ratio, lengths, turns):
    current, behaviour, mask, turn_index = rows_with_ratio(log_ratio, [max(n, turns) for n in lengths], turns)
    weights, _ = importance_weights(current, behaviour, mask, mode, 0.5, 2.0, turn_index)
    assert spread(episode_weights(weights, mask)) < 1e-5


@pytest.mark.parametrize("mode, short_weight, long_weight", [
    ("sequence_mask", 1.01 ** 10, 0.0),  # 1.01^1000 = 2.1e4 > clip_max 3: the long episode is dropped
    ("sequence_truncate", 1.01 ** 10, 3.0),
])
def test_trls_sequence_modes_weigh_a_long_episode_by_its_length(mode, short_weight, long_weight):
    current, behaviour, mask, _ = rows_with_ratio(math.log(1.01), [10, 1000])
    weights, outside = importance_weights(current, behaviour, mask, mode, None, 3.0)
    assert weights.shape == (2, 1)
    assert weights[:, 0].tolist() == pytest.approx([short_weight, long_weight], rel=1e-4)
    assert outside[:, 0].tolist() == [False, True]


def test_each_mode_by_hand():
    # one row, two turns of two trained tokens with an untrained observation token between them;
    # per-token log-ratios d = [log 2, log 8 | obs | log 0.5, NaN behaviour (counts 0)]
    behaviour = torch.tensor([[0.0, 0.0, 0.0, 0.0, float("nan")]])
    current = torch.tensor([[math.log(2), math.log(8), 5.0, math.log(0.5), -1.0]])
    mask = torch.tensor([[1, 1, 0, 1, 1]])
    turns = turn_ids([[(0, 2), (3, 5)]], 5)
    expected = {
        "token_truncate": [[2, 3, 1, 0.5, 1]],  # 8 clamped to 3; an untrained token: 1
        "token_mask": [[2, 0, 1, 0.5, 1]],
        "turn_truncate": [[3, 3, 1, 0.5 ** 0.5, 0.5 ** 0.5]],  # geometric means 4 -> 3 and sqrt(0.5)
        "turn_mask": [[0, 0, 1, 0.5 ** 0.5, 0.5 ** 0.5]],
        "geometric_truncate": [[(2 * 8 * 0.5) ** 0.25]],  # over the 4 trained tokens
        "geometric_mask": [[(2 * 8 * 0.5) ** 0.25]],
        "sequence_truncate": [[3.0]],  # 2 * 8 * 0.5 = 8
        "sequence_mask": [[0.0]],
    }
    assert set(expected) == set(IMPORTANCE_SAMPLING_MODES)
    for mode, want in expected.items():
        weights, _ = importance_weights(current, behaviour, mask, mode, None, 3.0, turns)
        assert weights.shape == (1, len(want[0]))
        assert weights[0].tolist() == pytest.approx(want[0], rel=1e-5), mode


def test_clip_min_bounds_from_below():
    current, behaviour, mask, _ = rows_with_ratio(math.log(0.2), [3])
    truncated, outside = importance_weights(current, behaviour, mask, "token_truncate", 0.5, 2.0)
    assert truncated[mask.bool()].tolist() == pytest.approx([0.5] * 3) and outside[mask.bool()].all()
    masked, _ = importance_weights(current, behaviour, mask, "token_mask", 0.5, 2.0)
    assert masked[mask.bool()].tolist() == [0.0] * 3


def test_weight_statistics_by_hand():
    # rows 0 and 1 are two steps of one episode, row 2 another episode, row 3 padding
    weights = torch.tensor([[1.0, 3.0], [1.0, 1.0], [0.5, 1.0], [1.0, 1.0]])
    outside = torch.tensor([[False, True], [False, False], [False, False], [True, True]])
    trained = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0]])
    stats = weight_statistics(weights, outside, trained, [7, 7, 9, 7])
    w = torch.tensor([1.0, 3.0, 1.0, 0.5, 1.0])
    assert stats == pytest.approx({
        "importance_sampling_ratio/min": 0.5, "importance_sampling_ratio/mean": w.mean().item(),
        "importance_sampling_ratio/max": 3.0,
        "importance_sampling_ratio/ess": (w.sum() ** 2 / (5 * (w * w).sum())).item(),
        "importance_sampling_clipped/tokens": 1 / 5,  # the padding row's flags do not count
        "importance_sampling_clipped/episodes": 1 / 2,  # episode 7 once, though two of its rows train
    })
    assert weight_statistics(weights, outside, torch.zeros_like(trained), [0, 1, 2, 3]) == {}


@pytest.mark.parametrize("overrides, message", [
    ({"vllm_importance_sampling_mode": "sequence"}, "vllm_importance_sampling_mode='sequence': give one of"),
    ({"vllm_importance_sampling_mode": "turn_truncate", "vllm_importance_sampling_clip_max": None},
     "vllm_importance_sampling_mode='turn_truncate' with vllm_importance_sampling_clip_min=None and "
     "vllm_importance_sampling_clip_max=None truncates nothing"),
])
def test_bad_importance_sampling_settings_are_refused_when_the_config_is_built(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
        config(**overrides)
    assert "\n" not in str(error.value)


def test_the_steps_vllm_correction_is_length_neutral_by_default_and_logs_its_statistics(tiny_chatml_model, tmp_path):
    # The step's own vLLM path (`MultiTurnStep.vllm_weights`) on a real rollout of episodes of 1 and 3 turns, with
    # stand-in sampling log-probs (named as such: vLLM does not run in this suite) 1% off the policy's on every token.
    rows = [{"target": 1}, {"target": 3}]
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, reward_mode="dense", max_turns=3, max_completion_length=4,
                        per_device_train_batch_size=2, num_generations=2)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                   train_dataset=Dataset.from_list(rows))
    trainer.model.train()
    torch.manual_seed(0)
    trainer._generate_and_score_completions(list(rows))
    batch, step = trainer.last_rollout, trainer.step
    assert sorted(ep.num_turns for ep in batch.episodes) == [1, 3]
    x = step.tensors(batch)
    old = torch.randn(x.trained.shape)
    x = dataclasses.replace(x, sampled_logps=old - math.log(1.01))
    trained = x.trained.bool()
    assert trained.sum(dim=1).tolist()[0] != trained.sum(dim=1).tolist()[1]  # episodes of different lengths
    weights = step.vllm_weights(x, old, batch)  # the default, token_truncate
    assert weights.expand_as(old)[trained].tolist() == pytest.approx([1.01] * int(trained.sum()), rel=1e-5)
    assert torch.all(weights[~trained] == 1.0)
    metrics = trainer._metrics["train"]
    assert metrics["sampling/importance_sampling_ratio/ess"][-1] == pytest.approx(1.0)
    assert metrics["sampling/importance_sampling_clipped/tokens"][-1] == 0.0
    assert metrics["sampling/importance_sampling_clipped/episodes"][-1] == 0.0
    for mode in ("turn_truncate", "geometric_truncate"):  # length-neutral through the batch's turn spans too
        trainer.args.vllm_importance_sampling_mode = mode
        assert step.vllm_weights(x, old, batch).expand_as(old)[trained].tolist() == pytest.approx(
            [1.01] * int(trained.sum()), rel=1e-5)
    trainer.args.vllm_importance_sampling_mode = "sequence_mask"  # TRL's: 1.01^n, a different weight per length
    weights = step.vllm_weights(x, old, batch)[:, 0]
    assert weights.tolist() == pytest.approx([1.01 ** int(n) for n in trained.sum(dim=1)], rel=1e-4)
    assert weights[0] != pytest.approx(weights[1].item(), rel=1e-3)
