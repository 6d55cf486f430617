"""The multi-turn GRPO, RLOO and PPO trainers with `use_vllm=True, vllm_mode="colocate"` on vLLM's CPU backend.

A real model (the offline SmolLM2-135M-Instruct), real TextWorld games, TRL's own vLLM integration: each trainer
trains three steps while every generate call and weight sync of its engine is recorded (`vllm_checks.py`).
"""

import logging
import math

import pytest
import torch
from rollout_checks import assert_env_mask_exact, assert_sample_token_exact, assert_token_exact, step_samples_of
from vllm_checks import (
    SYNC_TOLERANCE,
    VLLMRecorder,
    assert_sampled_by_vllm,
    assert_step_sampled_by_vllm,
    assert_trained_on_sampled_ids,
)

from trl_multiturn import (
    MultiTurnGRPOConfig,
    MultiTurnGRPOTrainer,
    MultiTurnPPOConfig,
    MultiTurnPPOTrainer,
    MultiTurnRLOOConfig,
    MultiTurnRLOOTrainer,
)
from trl_multiturn.envs import TextWorldEnv

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

STEPS = 3
log = logging.getLogger(__name__)


def reply_length(prompts, completions, **kwargs):
    """An extra trajectory reward that differs between episodes, so every step has non-zero advantages and moves
    the policy (the untrained model wins no game): the weight-sync checks need weights that change."""
    return [sum(len(m["content"]) for m in c if m["role"] == "assistant") / 100 for c in completions]


def rl_args(config_cls, output_dir, **overrides):
    """Settings every trainer of the session shares (they share one engine, whose arguments must agree)."""
    args = dict(
        output_dir=str(output_dir), max_turns=2, per_device_train_batch_size=4, max_completion_length=12,
        max_steps=STEPS, learning_rate=1e-4, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
        save_strategy="no", seed=0, use_vllm=True, vllm_mode="colocate",
        system_prompt="You are playing a text adventure game. Reply with a single command, such as 'go north'.",
    )
    args.update(overrides)
    return config_cls(**args)


def train(trainer_cls, config_cls, smollm2, textworld_games, tmp_path, reward_funcs=reply_length, **overrides):
    games_dir, tasks = textworld_games
    trainer = trainer_cls(model=smollm2, args=rl_args(config_cls, tmp_path, **overrides), train_dataset=tasks,
                          environment_factory=lambda: TextWorldEnv(games_dir=games_dir), reward_funcs=reward_funcs)
    recorder = VLLMRecorder(trainer)
    result = trainer.train()
    return trainer, recorder, result


@pytest.fixture(scope="module")
def grpo(smollm2, textworld_games, tmp_path_factory):
    return train(MultiTurnGRPOTrainer, MultiTurnGRPOConfig, smollm2, textworld_games, tmp_path_factory.mktemp("grpo"),
                 num_generations=2)


@pytest.fixture(scope="module")
def rloo(smollm2, textworld_games, tmp_path_factory):
    # beta=0: no reference model (RLOO's KL penalty uses the policy's own log-probs, not vLLM's), less compute.
    return train(MultiTurnRLOOTrainer, MultiTurnRLOOConfig, smollm2, textworld_games, tmp_path_factory.mktemp("rloo"),
                 num_generations=2, beta=0.0)


@pytest.fixture(scope="module")
def ppo(smollm2, textworld_games, tmp_path_factory):
    # kl_coef=0: no reference model (the KL folded into PPO's reward is no vLLM concern), a third less compute.
    return train(MultiTurnPPOTrainer, MultiTurnPPOConfig, smollm2, textworld_games, tmp_path_factory.mktemp("ppo"),
                 kl_coef=0.0)


def assert_trained(trainer, result):
    assert trainer.state.global_step == STEPS and math.isfinite(result.training_loss)
    logged = [entry for entry in trainer.state.log_history if "episodes/mean_turns" in entry]
    assert len(logged) == STEPS and all(entry["episodes/failed"] == 0 for entry in logged)
    assert all(0 < entry["episodes/trained_token_fraction"] < 1 for entry in logged)


def assert_every_sync_reaches_vllm(recorder):
    syncs = [sync for sync in recorder.syncs if sync[0] < STEPS]  # later tests generate (and sync) after training
    log.info("weight syncs (step, gap before, gap after): %s", syncs)
    assert [step for step, _, _ in syncs] == list(range(STEPS)), "one sync per step, before its rollouts"
    for step, before, after in syncs:
        assert after < SYNC_TOLERANCE, f"step {step}: vLLM's log-probs are {after:.2e} off the policy's after a sync"
        if step > 0:  # the policy moved since the last sync: skipping this one would leave vLLM measurably stale
            assert before > 5 * SYNC_TOLERANCE, f"step {step}: the policy barely moved ({before:.2e})"


def assert_batches_are_vllm_samples(recorder, mask_of):
    assert len(recorder.batches) == STEPS
    for batch in recorder.batches:
        output = batch["output"]
        mask = mask_of(output)
        for i, episode in enumerate(batch["episodes"]):
            assert_sampled_by_vllm(recorder, episode)
            assert_trained_on_sampled_ids(episode.prompt_ids, episode.completion_ids, episode.env_mask,
                                          output["prompt_ids"][i], output["completion_ids"][i], mask[i])


def grpo_mask(output):
    return output["completion_mask"] * output["tool_mask"]


# -- GRPO ------------------------------------------------------------------------------------------------------------


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
    completions, logprobs = trainer._generate_turn(contexts, max_new_tokens=3)
    assert len(completions) == len(logprobs) == len(contexts)
    assert all(1 <= len(c) <= 3 and len(lp) == len(c) for c, lp in zip(completions, logprobs))
    assert all(math.isfinite(x) for lp in logprobs for x in lp)
    assert trainer.vllm_generation.max_completion_length == trainer.args.max_completion_length


# -- GRPO, step-wise -------------------------------------------------------------------------------------------------

STEPWISE_STEPS = 2


@pytest.fixture(scope="module")
def grpo_stepwise(smollm2, textworld_games, tmp_path_factory):
    # Step-wise rewards come from the environment alone (no trajectory reward_funcs). window:1 over 3 turns: the
    # third step's context drops the first turn, so it is no prefix of the episode's token history.
    return train(MultiTurnGRPOTrainer, MultiTurnGRPOConfig, smollm2, textworld_games,
                 tmp_path_factory.mktemp("grpo_stepwise"), reward_funcs=None, num_generations=2, max_turns=3,
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


# -- RLOO ------------------------------------------------------------------------------------------------------------


def test_rloo_trains_on_textworld_with_colocated_vllm(rloo):
    trainer, recorder, result = rloo
    assert_trained(trainer, result)
    assert_every_sync_reaches_vllm(recorder)
    assert_batches_are_vllm_samples(recorder, lambda output: output["env_mask"])


def test_rloo_turn_through_vllm_is_capped_and_answers_each_context_once(rloo):
    trainer, recorder, _ = rloo
    assert trainer.num_generations == 2
    contexts = [list(recorder.probe)] * 3
    completions, logprobs = trainer._generate_turn(contexts, max_new_tokens=3)
    assert len(completions) == len(contexts) and logprobs is None
    assert all(1 <= len(c) <= 3 for c in completions)
    assert trainer.num_generations == 2 and trainer.vllm_generation.max_completion_length == 12


# -- PPO -------------------------------------------------------------------------------------------------------------


def test_ppo_trains_on_textworld_with_colocated_vllm(ppo):
    trainer, recorder, result = ppo
    assert_trained(trainer, result)
    assert_every_sync_reaches_vllm(recorder)
    assert_batches_are_vllm_samples(recorder, grpo_mask)
    assert all("critic/value_loss" in entry for entry in trainer.state.log_history if "loss" in entry)
