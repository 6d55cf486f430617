"""Multi-turn RLOO with a colocated vLLM engine (CPU)."""

from colocate_runs import assert_batches_are_vllm_samples, assert_every_sync_reaches_vllm, assert_trained, trained

from trl_multiturn import MultiTurnRLOOConfig, MultiTurnRLOOTrainer

# beta=0: no reference model (RLOO's KL penalty uses the policy's own log-probs, not vLLM's), less compute.
rloo = trained(MultiTurnRLOOTrainer, MultiTurnRLOOConfig, num_generations=2, beta=0.0)


def test_rloo_trains_on_textworld_with_colocated_vllm(rloo):
    trainer, recorder, result = rloo
    assert_trained(trainer, result)
    assert_every_sync_reaches_vllm(recorder)
    assert_batches_are_vllm_samples(recorder, lambda output: output["tool_mask"])


def test_rloo_turn_through_vllm_is_capped_and_answers_each_context_once(rloo):
    trainer, recorder, _ = rloo
    assert trainer.num_generations == 2
    contexts = [list(recorder.probe)] * 3
    completions, logprobs = trainer.generation(contexts, max_new_tokens=3)
    assert len(completions) == len(contexts) and logprobs is None
    assert all(1 <= len(c) <= 3 for c in completions)
    assert trainer.num_generations == 2 and trainer.vllm_generation.max_completion_length == 12
