"""A plain `transformers` generate function for the collator, for evaluation and scripts outside a trainer, and
the end-of-reply token ids that evaluation and SFT share with the RL trainers.

Inside a trainer the collator uses the trainer's own backend (transformers, vLLM colocate or server) instead.
"""

from __future__ import annotations

import torch


def left_pad(contexts: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into `(input_ids, attention_mask)` tensors."""
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for row, context in enumerate(contexts):
        ids[row, width - len(context):] = torch.tensor(context, dtype=torch.long)
        mask[row, width - len(context):] = 1
    return ids, mask


def strip_after_eos(ids: list[int], eos_token_ids) -> list[int]:
    """Keep tokens up to and including the first end-of-sequence token."""
    for k, token in enumerate(ids):
        if token in eos_token_ids:
            return ids[: k + 1]
    return ids


def hf_generate_fn(model, tokenizer, eos_token_ids=None, temperature: float = 0.0, top_p: float = 1.0,
                   top_k: int = 0, batch_size: int = 16):
    """A `GenerateFn` over `model.generate`: greedy when `temperature == 0`, else sampling."""
    eos = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    sampling = {"do_sample": False} if temperature == 0 else {
        "do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k
    }

    @torch.no_grad()
    def generate(contexts: list[list[int]], max_new_tokens: int):
        device = next(model.parameters()).device
        out: list[list[int]] = []
        for start in range(0, len(contexts), batch_size):
            ids, mask = left_pad(contexts[start: start + batch_size], pad)
            generated = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                eos_token_id=eos, pad_token_id=pad, **sampling,
            )
            out += [strip_after_eos(row.tolist(), eos) for row in generated[:, ids.shape[1]:].cpu()]
        return out, None

    return generate


def generation_eos_ids(model) -> list[int]:
    """The generation-config eos ids of `model` (an object or a path); [] when it has none."""
    from transformers import GenerationConfig

    if isinstance(model, str):
        try:
            config = GenerationConfig.from_pretrained(model)
        except OSError:  # no generation_config.json: the RL trainers then use the tokenizer's eos alone
            return []
    else:
        config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def reply_eos_ids(tokenizer, generation_eos: list[int]) -> list[int]:
    """The ids a reply stops on, as the RL trainers take them: the tokenizer's eos, then the model's
    generation-config eos ids (`generation_eos_ids`) other than it."""
    return [tokenizer.eos_token_id, *(t for t in generation_eos if t != tokenizer.eos_token_id)]
