"""What the vLLM tests record and check: every generate call and weight sync of a trainer's colocated engine."""

from __future__ import annotations

import torch

# Largest |log p_vLLM - log p_policy| allowed on any token of the probe sequence right after a weight sync. Both sides
# compute in float32 (the CPU shim gives the engine the policy's dtype) and differ only in kernels and summation
# order (vLLM's paged attention, its fused norms and rotary embedding); measured here: a few 1e-5. One optimizer
# step of the tests (Adam, lr 1e-4) moves them by more than 0.05, so a skipped or partial sync fails this bound.
SYNC_TOLERANCE = 1e-2


def probe_ids(tokenizer) -> list[int]:
    """A fixed conversation (an observation and a reply) as token ids: the sequence every sync is checked on."""
    messages = [
        {"role": "user", "content": "You are in a kitchen. There is a closed fridge and a wooden table. Exits lead "
                                    "north and east."},
        {"role": "assistant", "content": "open the fridge"},
    ]
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def vllm_sequence_logprobs(llm, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 under the vLLM engine (its prompt log-probs)."""
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0),
                       use_tqdm=False)
    prompt_logprobs = out[0].prompt_logprobs
    return torch.tensor([prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))], dtype=torch.float64)


@torch.no_grad()
def policy_sequence_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 under the training policy."""
    logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0, :-1].double()
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:], device=model.device)[:, None])[:, 0].cpu()


class VLLMRecorder:
    """Wraps a trainer's `VLLMGeneration`: records every `generate` call and measures every weight sync.

    `calls`: per call, the contexts sent, the reply cap in force, the ids and log-probs vLLM returned.
    `syncs`: per sync, (global_step, gap before, gap after), the gap being the largest per-token difference between
    vLLM's and the policy's log-probs of the probe sequence. The gap before a sync is what generation would see if
    the sync were skipped.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.generation = trainer.vllm_generation
        self.probe = probe_ids(trainer.processing_class)
        self.calls: list[dict] = []
        self.syncs: list[tuple[int, float, float]] = []
        self.batches: list[dict] = []
        generate, sync = self.generation.generate, self.generation.sync_weights
        score = trainer._generate_and_score_completions

        def recorded_generate(**kwargs):
            cap = self.generation.max_completion_length
            out = generate(**kwargs)
            self.calls.append({"contexts": [list(p) for p in kwargs["prompts"]], "cap": cap,
                               "completions": [list(c) for c in out[1]],
                               "logprobs": None if out[2] is None else [[lp[0] for lp in seq] for seq in out[2]]})
            return out

        def measured_sync():
            before = self.gap()
            sync()
            self.syncs.append((trainer.state.global_step, before, self.gap()))

        def recorded_score(inputs):
            output = score(inputs)
            rollout = trainer.last_rollout
            self.batches.append({"episodes": list(rollout.episodes), "steps": rollout.steps, "output": output})
            return output

        self.generation.generate = recorded_generate
        self.generation.sync_weights = measured_sync
        trainer._generate_and_score_completions = recorded_score

    def gap(self) -> float:
        vllm_logps = vllm_sequence_logprobs(self.generation.llm, self.probe)
        return (vllm_logps - policy_sequence_logprobs(self.trainer.model, self.probe)).abs().max().item()

    def replies(self) -> dict[tuple[int, ...], list[tuple[list[int], list[float] | None, int]]]:
        """Context (as a tuple of ids) -> every (ids vLLM returned, their log-probs, the reply cap) for it: the
        episodes of one task share their first context."""
        replies = {}
        for call in self.calls:
            logprobs = call["logprobs"] or [None] * len(call["completions"])  # RLOO asks vLLM for none
            for context, ids, logps in zip(call["contexts"], call["completions"], logprobs):
                replies.setdefault(tuple(context), []).append((ids, logps, call["cap"]))
        return replies


def assert_sampled_by_vllm(recorder: VLLMRecorder, episode) -> None:
    """Each turn's context is exactly the episode's token history (prompt, earlier replies, observations) as sent to
    vLLM, and the turn's reply ids (and log-probs, where the trainer asks vLLM for them) are exactly those vLLM
    returned for it."""
    replies = recorder.replies()
    assert episode.turn_spans, "the episode has no reply"
    for start, end in episode.turn_spans:
        context = tuple(episode.prompt_ids + episode.completion_ids[:start])
        assert context in replies, "a context sent to vLLM differs from the episode's own token history"
        reply, reply_logps = episode.completion_ids[start:end], episode.logprobs[start:end]
        assert any(reply == ids and len(ids) <= cap and (logps is None or reply_logps == logps)
                   for ids, logps, cap in replies[context])


def assert_step_sampled_by_vllm(recorder: VLLMRecorder, sample) -> None:
    """Step-wise: the step's context is exactly one vLLM was sent, and its reply ids and log-probs are exactly those
    vLLM returned for that context."""
    replies = recorder.replies().get(tuple(sample.prompt_ids))
    assert replies, "a step's context differs from every context sent to vLLM"
    assert any(sample.completion_ids == ids and len(ids) <= cap and sample.logprobs == logps
               for ids, logps, cap in replies)


def assert_trained_on_sampled_ids(prompt_ids: list[int], completion_ids: list[int], mask: list[int],
                                  prompt_row: torch.Tensor, completion_row: torch.Tensor,
                                  mask_row: torch.Tensor) -> None:
    """The padded row the loss sees holds the sample's exact ids (an episode's, or a step's), and its loss mask is
    the sample's mask."""
    assert completion_row[: len(completion_ids)].tolist() == completion_ids
    assert prompt_row[-len(prompt_ids):].tolist() == prompt_ids
    assert mask_row[: len(mask)].tolist() == mask
    assert mask_row[len(mask):].sum() == 0
