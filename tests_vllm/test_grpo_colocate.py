"""Multi-turn GRPO with a colocated vLLM engine (CPU): weight syncs, token-exact samples, vLLM's log-probs in the
importance-sampling correction, capped turns."""

import logging
import math

import pytest
import torch
from colocate_runs import (
    STEPS,
    assert_batches_are_vllm_samples,
    assert_every_sync_reaches_vllm,
    assert_trained,
    grpo_mask,
    trained,
)
from rollout_checks import assert_env_mask_exact, assert_token_exact
from vllm_checks import SYNC_TOLERANCE, assert_sampled_by_vllm

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

log = logging.getLogger(__name__)

grpo = trained(MultiTurnGRPOTrainer, MultiTurnGRPOConfig, num_generations=2)


def test_grpo_trains_on_textworld_with_colocated_vllm(grpo):
    trainer, _, result = grpo
    assert_trained(trainer, result)


def test_every_weight_sync_reaches_vllm(grpo):
    assert_every_sync_reaches_vllm(grpo[1])


def test_trained_tokens_are_the_tokens_vllm_sampled(grpo):
    trainer, recorder, _ = grpo
    assert_batches_are_vllm_samples(recorder, grpo_mask)
    for batch in recorder.batches:
        for episode in batch["episodes"]:
            assert_env_mask_exact(trainer.processing_class, episode)


def test_vllm_sampling_logprobs_reach_the_importance_sampling_correction(grpo):
    trainer, recorder, _ = grpo
    for batch in recorder.batches:
        output, mask = batch["output"], grpo_mask(batch["output"]).bool()
        sampled = torch.nan_to_num(output["sampling_per_token_logps"])
        vllm_logps = [torch.tensor(ep.logprobs)[torch.tensor(ep.env_mask).bool()] for ep in batch["episodes"]]
        assert all(torch.equal(sampled[i][mask[i]], lp) for i, lp in enumerate(vllm_logps))
        assert "importance_sampling_ratio" in output
    logged = [entry for entry in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in entry]
    log.info("importance sampling: %s", [{k: v for k, v in entry.items() if k.startswith("sampling/")}
                                         for entry in logged])
    assert len(logged) == STEPS
    for entry in logged:  # rollouts come right after a sync: vLLM's and the policy's log-probs agree
        assert 0 < entry["sampling/sampling_logp_difference/mean"] < SYNC_TOLERANCE / 10
        assert entry["sampling/sampling_logp_difference/max"] < SYNC_TOLERANCE * 10
        for stat in ("min", "mean", "max"):
            assert entry[f"sampling/importance_sampling_ratio/{stat}"] == pytest.approx(1.0, abs=0.05)
        # the default token_truncate: weights this close to 1 are never clipped, and their ESS is close to 1
        assert entry["sampling/importance_sampling_ratio/ess"] > 0.99
        assert entry["sampling/importance_sampling_clipped/tokens"] == 0.0
        assert entry["sampling/importance_sampling_clipped/episodes"] == 0.0


def test_greedy_rollouts_through_vllm_are_token_exact(grpo, textworld_games):
    trainer, recorder, _ = grpo
    generation = trainer.vllm_generation
    generation.temperature = 0.0  # greedy: every sampled token must be the policy's argmax given the exact history
    try:
        episodes = trainer.episode_runner(list(textworld_games[1])[:2])
    finally:
        generation.temperature = trainer.args.temperature
    for episode in episodes:
        assert episode.num_turns >= 2
        assert_sampled_by_vllm(recorder, episode)
        assert_token_exact(trainer.model, episode)
        assert_env_mask_exact(trainer.processing_class, episode)


def test_a_turn_through_vllm_is_capped_and_answers_each_context_once(grpo):
    trainer = grpo[0]
    contexts = [list(grpo[1].probe)] * 3 + [list(grpo[1].probe[:-4])]
    completions, logprobs = trainer.generation(contexts, max_new_tokens=3)
    assert len(completions) == len(logprobs) == len(contexts)
    assert all(1 <= len(c) <= 3 and len(lp) == len(c) for c, lp in zip(completions, logprobs))
    assert all(math.isfinite(x) for lp in logprobs for x in lp)
    assert trainer.vllm_generation.max_completion_length == trainer.args.max_completion_length
