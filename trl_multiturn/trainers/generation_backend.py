"""The step's generation backend: the `generate_fn` the episode runners call, one reply per live episode per call.

The trainer builds one `GenerationBackend` at set-up and hands it to the episode runner (its `generate_fn`), the
episode source (`rollout()` around every rollout) and the dynamic sampler (`any_live`). It generates through one of
two paths, chosen once:

- the episode-history cache (`rollout.generation.CachedGenerator`): transformers' forward with each episode's KV
  cache kept from turn to turn, where it reproduces TRL's sampling (`Sampling.plain`) and the model's layers allow it
  (`cache_episode_history`); the model is unwrapped for it once per rollout (`rollout()`);
- TRL's own single-turn generation everywhere else (`_generate_single_turn`: transformers' `generate`, continuous
  batching, vLLM colocate or server), reached through the `sample_replies` callable the trainer hands over
  (`trl_compat.single_turn_replies`), each call's replies capped at the live episodes' budget through the cap TRL
  reads (`trl_compat.capped_replies`).

Every rank makes the same number of generate calls per rollout (`any_live`): a rank with no live episode still takes
part in a call, so collective generation (vLLM server mode, ZeRO-3, FSDP) cannot hang.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation

from ..model_layers import streaming_layers
from ..rollout.generation import CachedGenerator


@dataclass(frozen=True)
class Sampling:
    """TRL's sampling settings of a trainer (its `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty` and
    the config's `generation_kwargs`)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float | None = None
    repetition_penalty: float = 1.0
    generation_kwargs: dict | None = None

    @property
    def plain(self) -> bool:
        """Whether the episode-history cache samples as TRL does: temperature, top-p and top-k only."""
        return self.min_p is None and self.repetition_penalty == 1.0 and not self.generation_kwargs


class GenerationBackend:
    """How the policy generates one reply per episode context (see the module docstring).

    Args:
        accelerator: the trainer's; its processes take part in every call together.
        args: the trainer's config (`cache_episode_history`, `rollout_overlap`, `ds3_gather_for_generation`,
            `gradient_checkpointing_kwargs`).
        policy: the unwrapped policy the episode-history cache is built on.
        wrapped_model: `() -> the trainer's wrapped model` (DeepSpeed, FSDP, DDP), unwrapped around each rollout.
        tokenizer / stop_token_ids: the policy's tokenizer (its pad token fills a dummy context) and the ids that end
            a reply.
        sampling: TRL's sampling settings.
        sample_replies: `(contexts) -> (completions, logprobs | None)`, TRL's single-turn generation, one reply per
            context under the cap `reply_cap`.
        reply_cap: `(max_new_tokens) -> context manager` in which `sample_replies` caps each reply at that many
            tokens (`trl_compat.capped_replies`: TRL takes no cap as an argument).
        use_vllm: whether `sample_replies` generates with vLLM (no episode-history cache; a rank with no context
            calls it with none instead of a dummy).
        trl_generation_only: TRL's generation must run whatever the settings (its continuous batching).
    """

    def __init__(self, accelerator, args, *, policy: torch.nn.Module, wrapped_model: Callable[[], torch.nn.Module],
                 tokenizer, stop_token_ids: list[int], sampling: Sampling,
                 sample_replies: Callable[[list[list[int]]], tuple],
                 reply_cap: Callable[[int], AbstractContextManager], use_vllm: bool,
                 trl_generation_only: bool = False):
        self.accelerator, self.args, self.policy, self.wrapped_model = accelerator, args, policy, wrapped_model
        self.tokenizer, self.stop_token_ids, self.sampling = tokenizer, stop_token_ids, sampling
        self.sample_replies, self.reply_cap, self.use_vllm = sample_replies, reply_cap, use_vllm
        self.cached = (args.cache_episode_history and not use_vllm and not trl_generation_only and sampling.plain
                       and not streaming_layers(policy))
        self.history_cache = self.new_history_cache()

    def new_history_cache(self, generator: torch.Generator | None = None) -> CachedGenerator | None:
        """An episode-history cache on the policy, sampling from `generator` (else torch's global one), or None where
        TRL's own generation runs (see the module docstring)."""
        if not self.cached:
            return None
        s = self.sampling
        return CachedGenerator(self.policy, self.tokenizer, self.stop_token_ids, temperature=s.temperature,
                               top_p=s.top_p, top_k=s.top_k, streams=2 if self.args.rollout_overlap else 1,
                               generator=generator)

    def __call__(self, contexts: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], list | None]:
        """One reply per context, each at most `max_new_tokens` long: `(completions, logprobs | None)`. A rank with
        no live episode still takes part (with a one-token dummy context outside vLLM) so collective generation
        cannot hang; alone, it skips the call."""
        if not contexts and self.accelerator.num_processes == 1:
            return [], None
        dummy = not contexts and not self.use_vllm
        batch = [[self.tokenizer.pad_token_id]] if dummy else contexts
        if self.history_cache is not None:
            completions, logprobs = self.history_cache(batch, max_new_tokens)  # its model: set by `rollout()`
        else:
            with self.reply_cap(max_new_tokens):
                completions, logprobs = self.sample_replies(batch)
        if dummy:
            return [], None
        return [list(c) for c in completions], logprobs

    def any_live(self, local_live: int) -> bool:
        """True while any rank has a live episode: every rank then makes the same number of generate calls."""
        if self.accelerator.num_processes == 1:
            return local_live > 0
        count = torch.tensor([local_live], device=self.accelerator.device)
        return bool(self.accelerator.reduce(count, reduction="sum").item() > 0)

    @contextmanager
    def rollout(self):
        """Around a whole rollout: the episode-history cache emptied (the weights changed since the last rollout, and
        its memory is freed after), its model the wrapped model unwrapped as TRL unwraps it for one `generate` call
        (gradient checkpointing off, ZeRO-3 parameters gathered, FSDP parameters summoned): once per rollout rather
        than once per turn, since switching gradient checkpointing off and on walks every module. TRL's own
        generation unwraps the model itself, per call."""
        cache = self.history_cache
        if cache is None:
            yield
            return
        cache.reset()
        try:
            wrapped, args = self.wrapped_model(), self.args
            with (
                unwrap_model_for_generation(wrapped, self.accelerator,
                                            gather_deepspeed3_params=args.ds3_gather_for_generation) as unwrapped,
                disable_gradient_checkpointing(unwrapped, args.gradient_checkpointing_kwargs),
                full_fsdp1_parameters(wrapped, self.accelerator),
            ):
                cache.model = unwrapped
                yield
        finally:
            cache.reset()


def full_fsdp1_parameters(model, accelerator):
    """Under FSDP v1, a context in which `model`'s own parameters are whole (torch's `summon_full_params`,
    `recurse=False`: its submodules gather theirs in their forwards); FSDP v2 and every other backend keep whole
    parameters reachable, so elsewhere it does nothing."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is None or getattr(plugin, "fsdp_version", 1) != 1:
        return nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel.summon_full_params(model, recurse=False)
