"""Step-wise multi-turn GRPO (`episode_format="stepwise"`, a windowed history) with a colocated vLLM engine (CPU)."""

import math

from colocate_runs import grpo_mask, trained
from rollout_checks import assert_sample_token_exact, step_samples_of
from vllm_checks import assert_step_sampled_by_vllm, assert_trained_on_sampled_ids

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

STEPWISE_STEPS = 2


# Step-wise rewards come from the environment alone (no trajectory reward_funcs). window:1 over 3 turns: the
# third step's context drops the first turn, so it is no prefix of the episode's token history.
grpo_stepwise = trained(MultiTurnGRPOTrainer, MultiTurnGRPOConfig, reward_funcs=None, num_generations=2, max_turns=3,
                        max_steps=STEPWISE_STEPS, episode_format="stepwise", history="window:1")


def test_stepwise_rows_are_the_step_contexts_and_replies_vllm_sampled(grpo_stepwise):
    trainer, recorder, result = grpo_stepwise
    assert trainer.state.global_step == STEPWISE_STEPS and math.isfinite(result.training_loss)
    assert len(recorder.batches) == STEPWISE_STEPS
    windowed = 0
    for batch in recorder.batches:
        output = batch["output"]
        mask = grpo_mask(output)
        assert len(batch["steps"]) == len(output["completion_ids"])
        for i, step in enumerate(batch["steps"]):
            if step is None:  # padding: trained on nothing
                assert mask[i].sum() == 0
                continue
            windowed += step.turn >= 2
            assert_step_sampled_by_vllm(recorder, step)
            assert_trained_on_sampled_ids(step.prompt_ids, step.completion_ids, step.mask,
                                          output["prompt_ids"][i], output["completion_ids"][i], mask[i])
    assert windowed, "no step played past the window, so nothing checked a windowed context"


def test_greedy_stepwise_rollouts_through_vllm_are_token_exact_per_step(grpo_stepwise, textworld_games):
    trainer, recorder, _ = grpo_stepwise
    generation = trainer.vllm_generation
    generation.temperature = 0.0
    try:
        episodes = trainer.episode_runner(list(textworld_games[1])[:2])
    finally:
        generation.temperature = trainer.args.temperature
    samples = step_samples_of(episodes)
    assert max(sample.turn for sample in samples) >= 2
    for sample in samples:
        assert_step_sampled_by_vllm(recorder, sample)
        assert_sample_token_exact(trainer.model, sample)
