"""Which token-mixing layers a model has: the one place that reads a model's layer types, for every path that
lays several sequences out in one (prefix-tree packing, trainers/packing.py) or feeds a sequence in padded chunks
(the episode-history cache, rollout/generation.py).

Attention layers separate sequences, and ignore padding, through their attention mask. A layer that runs over the
sequence as a stream (a recurrence or a convolution: the Gated DeltaNet linear attention of Qwen3.5 and Qwen3-Next,
the Mamba2 layers of Nemotron-H, Falcon-H1 and GraniteMoeHybrid, LFM2's short convolutions) carries a state from
each token to the next, whatever the mask says: a packed row reads its pack's earlier rows, a padding token in the
middle of a row enters the state.
"""

from __future__ import annotations

MASKED_LAYER_TYPES = ("full_attention", "sliding_attention")
"""`config.layer_types` entries whose layers attend through the attention mask."""
POINTWISE_LAYER_TYPES = ("mlp", "moe")
"""`config.layer_types` entries whose layers mix no tokens (Nemotron-H's MLP and MoE layers). Any other layer type
(transformers' "linear_attention" for Gated DeltaNet and Mamba layers, "conv", "hybrid", "chunked_attention", a new
one) counts as streaming: a path that needs masks alone is allowed where it is known exact, not where it is not
known wrong."""


def streaming_layers(model) -> str | None:
    """What in `model` runs over the sequence as a stream, in words ("layer_types ['conv'] and convolutions in
    ['Lfm2ShortConv']"), or None for a model whose token mixing is masked attention only.

    Two signs, either one counts: the config's `layer_types` holding a type outside `MASKED_LAYER_TYPES` and
    `POINTWISE_LAYER_TYPES`, and a `torch.nn.Conv1d` (a convolution over the sequence; the Mamba, Mamba2, Gated
    DeltaNet and LFM2 mixers each hold one) among the language model's modules, named by the class that holds it, so
    that a family no list names is caught by what it instantiates."""
    model = unwrap(model)
    config = text_config(model)
    unmasked = sorted({kind for kind in getattr(config, "layer_types", None) or ()
                       if kind not in MASKED_LAYER_TYPES + POINTWISE_LAYER_TYPES})
    convolved = sorted({type(module).__name__ for module in convolution_holders(model)})
    found = ([f"layer_types {unmasked}"] if unmasked else []) + ([f"convolutions in {convolved}"] if convolved else [])
    return " and ".join(found) or None


def convolution_holders(model) -> list:
    """The modules of `model`'s language model that hold a `torch.nn.Conv1d` (a convolution over the sequence: the
    Mamba, Mamba2, Gated DeltaNet and LFM2 mixers each hold one)."""
    import torch

    model = unwrap(model)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    return [module for module in decoder.modules()
            if any(isinstance(child, torch.nn.Conv1d) for child in module.children())]


def model_name(model) -> str:
    """The class and model type of `model` under its DDP, DeepSpeed or PEFT wrapper, as refusals name it."""
    model = unwrap(model)
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    return f"{type(model).__name__} ({getattr(text_config(model), 'model_type', None) or 'no model_type'})"


def unwrap(model):
    """`model` without its DDP or DeepSpeed wrappers."""
    import torch

    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def text_config(model):
    """The config of `model`'s language model (a multimodal config's text config), or None."""
    config = getattr(unwrap(model), "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config
