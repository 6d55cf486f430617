"""Multi-turn PPO (policy and critic) with a colocated vLLM engine (CPU)."""

from colocate_runs import (
    assert_batches_are_vllm_samples,
    assert_every_sync_reaches_vllm,
    assert_trained,
    grpo_mask,
    trained,
)

from trl_multiturn import MultiTurnPPOConfig, MultiTurnPPOTrainer

# kl_coef=0: no reference model (the KL folded into PPO's reward is no vLLM concern), a third less compute.
ppo = trained(MultiTurnPPOTrainer, MultiTurnPPOConfig, kl_coef=0.0)


def test_ppo_trains_on_textworld_with_colocated_vllm(ppo):
    trainer, recorder, result = ppo
    assert_trained(trainer, result)
    assert_every_sync_reaches_vllm(recorder)
    assert_batches_are_vllm_samples(recorder, grpo_mask)
    assert all("critic/value_loss" in entry for entry in trainer.state.log_history if "loss" in entry)
