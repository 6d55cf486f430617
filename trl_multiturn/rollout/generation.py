"""A plain `transformers` generate function for the collator, for evaluation and scripts outside a trainer, and
the end-of-reply token ids that evaluation and SFT share with the RL trainers.

Inside a trainer the collator uses the trainer's own backend (transformers, vLLM colocate or server) instead.
"""

from __future__ import annotations

import inspect

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


class CachedGenerator:
    """A `GenerateFn` that keeps each episode's key/value cache from one turn to the next.

    `hf_generate_fn` re-reads every episode's whole history at every turn: over an episode of K turns the model
    processes the prompt K times. Here each context is matched with the cache of the earlier context it extends (the
    collator only ever appends the reply and the observation's tokens), and only the new tokens are fed to the model,
    so every token of an episode is processed once. Contexts are decoded one at a time (no padding), greedily when
    `temperature == 0`, else by sampling with temperature, top-k and top-p. The caches of contexts that were not
    extended by the next call (finished episodes) are dropped.
    """

    def __init__(self, model, tokenizer, eos_token_ids=None, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0):
        from transformers.generation.logits_process import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.model = model
        self.eos = set(eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id])
        self.temperature = temperature
        warpers = []
        if temperature > 0:
            warpers.append(TemperatureLogitsWarper(temperature))
            if top_k:
                warpers.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                warpers.append(TopPLogitsWarper(top_p))
        self.warpers = LogitsProcessorList(warpers)
        self._caches: list[tuple[list[int], object]] = []  # (the ids a cache holds, the cache)
        # transformers renamed `past_key_values` to `cache` (5.2x); take whichever this model's forward has
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @torch.no_grad()
    def __call__(self, contexts: list[list[int]], max_new_tokens: int):
        kept, out = [], []
        for context in contexts:
            held, cache = self._take_cache(context)
            reply = self._reply(context, held, cache, max_new_tokens)
            kept.append((context + reply[:-1], cache))  # the last sampled token was never fed to the model
            out.append(reply)
        self._caches = kept
        return out, None

    def _take_cache(self, context: list[int]):
        from transformers import DynamicCache

        for index, (held, cache) in enumerate(self._caches):
            if len(held) < len(context) and context[: len(held)] == held:
                del self._caches[index]
                return held, cache
        return [], DynamicCache()

    def _reply(self, context: list[int], held: list[int], cache, max_new_tokens: int) -> list[int]:
        device = next(self.model.parameters()).device
        new = torch.tensor([context[len(held):]], dtype=torch.long, device=device)
        reply: list[int] = []
        while len(reply) < max_new_tokens:
            logits = self.model(input_ids=new, use_cache=True, **{self._cache_arg: cache}).logits[:, -1, :].float()
            token = self._pick(context + reply, logits)
            reply.append(token)
            if token in self.eos:
                break
            new = torch.tensor([[token]], dtype=torch.long, device=device)
        return reply

    def _pick(self, ids: list[int], logits: torch.Tensor) -> int:
        if self.temperature == 0:
            return int(logits.argmax(dim=-1))
        probs = torch.softmax(self.warpers(torch.tensor([ids], device=logits.device), logits), dim=-1)
        return int(torch.multinomial(probs, 1))


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
