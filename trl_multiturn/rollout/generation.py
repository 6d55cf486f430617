"""A plain `transformers` generate function for the runner, for evaluation and scripts outside a trainer, and
the end-of-reply token ids that evaluation and SFT share with the RL trainers.

Inside a trainer the runner uses the trainer's own backend (transformers, vLLM colocate or server) instead.
"""

from __future__ import annotations

import inspect

import torch

from ..model_layers import model_name, streaming_layers


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
    """A `GenerateFn` that keeps the live episodes' key/value cache from one turn to the next.

    `hf_generate_fn` re-reads every episode's whole history at every turn: over an episode of K turns the model
    processes the prompt K times. Here the episodes of a rollout share one batched cache, and at each turn only the
    tokens appended since the last (the end of the reply and the observation) are fed, so every token of an episode
    goes through the model once.

    How the batch stays aligned: each call's new tokens (a different number per episode) are left-padded into one
    chunk; padding and the steps after an episode's end-of-reply token are masked out of attention, and every real
    token is given its own position (its index in the episode), so the cache holds, per row, exactly the episode's
    tokens at their positions. Contexts must each extend the history of one row of the previous call (the runner
    only appends); episodes that ended are dropped from the batch. A call whose contexts do not all extend earlier
    ones (a new rollout, or a reply the caller cut) starts a fresh cache. Call `reset()` whenever the model's weights
    change: a cache computed with other weights must not be reused.

    With `streams > 1` it keeps that many such caches, for callers that alternate between disjoint sets of episodes
    (the runner's `overlap` halves): a call continues the cache whose rows its contexts extend, and a call that
    extends none replaces the cache used least recently.

    Models with layers that run over the sequence as a stream (`model_layers.streaming_layers`: Mamba, Gated
    DeltaNet, short convolutions) are refused: the padding inside a chunk would enter their state.

    Greedy when `temperature == 0`, else sampling with temperature, top-k and top-p, from `generator` when one is
    given (else torch's global generator).
    """

    def __init__(self, model, tokenizer, eos_token_ids=None, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, streams: int = 1, generator: torch.Generator | None = None):
        streaming = streaming_layers(model)
        if streaming:  # the chunks' padding would enter their state mid-sequence, and DynamicCache() holds none
            raise ValueError(f"{model_name(model)} has {streaming}, which the episode-history cache cannot feed in "
                             "padded chunks: generate with `hf_generate_fn` (trainers: cache_episode_history=False)")
        from transformers.generation.logits_process import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.model = model
        eos = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
        self.eos = set(eos)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        self.temperature = temperature
        warpers = []
        if temperature > 0:
            warpers.append(TemperatureLogitsWarper(temperature))
            if top_k:
                warpers.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                warpers.append(TopPLogitsWarper(top_p))
        self.warpers = LogitsProcessorList(warpers)
        # transformers renamed `past_key_values` to `cache` (5.2x); take whichever this model's forward has
        parameters = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        # only the last position's logits are sampled from: skip the LM head elsewhere (a prefill's other tokens)
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        self.streams = streams
        self.generator = generator
        self.reset()

    def reset(self) -> None:
        """Forget every cached episode (e.g. after a weight update)."""
        self._stored: list[tuple] = []  # the other streams' (cache, held, mask), least recently used first
        self._clear()

    def _clear(self) -> None:
        self._cache = None
        self._held: list[list[int]] = []  # per cache row: the episode tokens it holds
        self._mask: torch.Tensor | None = None  # (rows, cache length): 1 where the cache holds a real token

    def _switch_stream(self, contexts: list[list[int]]) -> list[int] | None:
        """Make current the stream whose rows `contexts` extend (see `_matching_rows`), storing the current one;
        None (and a fresh current stream, the least recently used one dropped) when none matches."""
        rows = self._matching_rows(contexts)
        if rows is not None or self.streams == 1:
            return rows
        for k, (cache, held, mask) in enumerate(self._stored):
            self._stored[k] = (self._cache, self._held, self._mask)
            self._cache, self._held, self._mask = cache, held, mask
            rows = self._matching_rows(contexts)
            if rows is not None:
                self._stored.append(self._stored.pop(k))  # the one just stored is now the most recent
                return rows
            self._cache, self._held, self._mask = self._stored[k]
            self._stored[k] = (cache, held, mask)
        if self._cache is not None:
            self._stored = [*self._stored, (self._cache, self._held, self._mask)][-(self.streams - 1):]
        return None

    @torch.no_grad()
    def __call__(self, contexts: list[list[int]], max_new_tokens: int):
        if not contexts:
            return [], None
        rows = self._switch_stream(contexts)
        if rows is None:
            self._clear()
            held = [[] for _ in contexts]
        else:
            index = torch.tensor(rows, device=self._mask.device)
            self._cache.batch_select_indices(index)
            self._mask = self._mask[index]
            held = [self._held[r] for r in rows]
        logits = self._feed([c[len(h):] for c, h in zip(contexts, held)], [len(h) for h in held])
        replies: list[list[int]] = [[] for _ in contexts]
        done = [False] * len(contexts)
        while True:
            tokens = self._pick(logits)
            for i, token in enumerate(tokens):
                if not done[i]:
                    replies[i].append(token)
                    done[i] = token in self.eos or len(replies[i]) >= max_new_tokens
            if all(done):
                break
            live_before = [len(c) + len(r) - 1 for c, r in zip(contexts, replies)]
            logits = self._feed([[] if d else [r[-1]] for d, r in zip(done, replies)], live_before)
        # each reply's last token was sampled but never fed
        self._held = [c + r[:-1] for c, r in zip(contexts, replies)]
        return replies, None

    def _matching_rows(self, contexts: list[list[int]]) -> list[int] | None:
        """For each context, the cache row whose tokens it extends; None unless every context has its own."""
        rows, free = [], set(range(len(self._held)))
        for context in contexts:
            row = next((r for r in sorted(free) if len(self._held[r]) < len(context)
                        and context[: len(self._held[r])] == self._held[r]), None)
            if row is None:
                return None
            rows.append(row)
            free.discard(row)
        return rows

    def _feed(self, chunks: list[list[int]], positions: list[int]) -> torch.Tensor:
        """Append each row's `chunks[i]` (left-padded to a common width; an empty chunk is all padding) at
        positions `positions[i]`, ...; return the logits after each row's last real token."""
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        width = max(len(chunk) for chunk in chunks)
        ids = torch.full((len(chunks), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(chunks), width), dtype=torch.long)
        position_ids = torch.zeros((len(chunks), width), dtype=torch.long)
        for i, (chunk, start) in enumerate(zip(chunks, positions)):
            if chunk:
                ids[i, width - len(chunk):] = torch.tensor(chunk)
                mask[i, width - len(chunk):] = 1
                position_ids[i, width - len(chunk):] = torch.arange(start, start + len(chunk))
        mask = mask.to(device)
        self._mask = mask if self._mask is None else torch.cat([self._mask, mask], dim=1)
        if self._cache is None:
            self._cache = DynamicCache()
        out = self.model(input_ids=ids.to(device), attention_mask=self._mask, position_ids=position_ids.to(device),
                         use_cache=True, **{self._cache_arg: self._cache}, **self._last_logits_only)
        return out.logits[:, -1, :].float()

    def _pick(self, logits: torch.Tensor) -> list[int]:
        if self.temperature == 0:
            return logits.argmax(dim=-1).tolist()
        placeholder_ids = torch.zeros((logits.shape[0], 1), dtype=torch.long, device=logits.device)
        probs = torch.softmax(self.warpers(placeholder_ids, logits), dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1).tolist()


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
