"""How the vLLM suite trains, and what every recorded run must show.

Each trainer trains `STEPS` steps with `use_vllm=True, vllm_mode="colocate"` on a real model (the offline
SmolLM2-135M-Instruct), real TextWorld games and TRL's own vLLM integration, while every generate call and weight sync
of its engine is recorded (`vllm_checks.VLLMRecorder`). Each trained configuration's tests are a module of their own,
and `scripts/test_vllm.sh` runs each trainer's modules (`test_<trainer>[_*].py`) in a process of their own, so that
a process holds one trainer's runs and one engine: the four trainers alive in one process took it to 15.3 GB.
"""

import logging
import math

import pytest
from vllm_checks import SYNC_TOLERANCE, VLLMRecorder, assert_sampled_by_vllm, assert_trained_on_sampled_ids

from trl_multiturn.envs import TextWorldEnv

# Two steps: the second sync is the first after the policy moved, the one that catches a skipped or partial sync (the
# first only checks that vLLM starts from the policy's weights); a third step checked the same code again.
STEPS = 2
log = logging.getLogger(__name__)


def reply_length(prompts, completions, **kwargs):
    """An extra trajectory reward that differs between episodes, so every step has non-zero advantages and moves
    the policy (the untrained model wins no game): the weight-sync checks need weights that change."""
    return [sum(len(m["content"]) for m in c if m["role"] == "assistant") / 100 for c in completions]


def rl_args(config_cls, output_dir, **overrides):
    """Settings every trainer shares (trainers in one process share one engine, whose arguments must agree)."""
    args = dict(
        output_dir=str(output_dir), max_turns=2, per_device_train_batch_size=4, max_completion_length=12,
        max_steps=STEPS, learning_rate=1e-4, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
        save_strategy="no", seed=0, use_vllm=True, vllm_mode="colocate",
        system_prompt="You are playing a text adventure game. Reply with a single command, such as 'go north'.",
    )
    args.update(overrides)
    return config_cls(**args)


def trained(trainer_cls, config_cls, reward_funcs=reply_length, **overrides):
    """A module fixture: (trainer, recorder, train output) of one training run with these config overrides."""

    @pytest.fixture(scope="module")
    def run(smollm2, textworld_games, tmp_path_factory):
        games_dir, tasks = textworld_games
        args = rl_args(config_cls, tmp_path_factory.mktemp("run"), **overrides)
        trainer = trainer_cls(model=smollm2, args=args, train_dataset=tasks, reward_funcs=reward_funcs,
                              environment_factory=lambda: TextWorldEnv(games_dir=games_dir))
        recorder = VLLMRecorder(trainer)
        return trainer, recorder, trainer.train()

    return run


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
