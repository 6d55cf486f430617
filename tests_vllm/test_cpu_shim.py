"""The CPU shim (`trl_multiturn.trainers.vllm_cpu`): what vLLM's CPU GEMM dispatch does to a linear layer, what the
shim does instead, and when it applies. No engine is built here."""

from types import SimpleNamespace

import pytest
import torch
import vllm.model_executor.layers.utils as vllm_layer_utils

from trl_multiturn.trainers.vllm_cpu import _keep_live_weight, colocated_vllm_on_cpu, engine_dtype, vllm_runs_on_cpu


def linear_layer():
    torch.manual_seed(0)
    return torch.nn.Linear(64, 96, bias=False)


def test_vllm_runs_on_cpu_here():
    assert vllm_runs_on_cpu()


def test_vllms_cpu_dispatch_breaks_in_place_weight_updates():
    """Without the shim: the Parameter that `load_weights` would write into is replaced (remove_weight=True), and
    where it is kept (remove_weight=False) the forward reads a copy packed at load time."""
    layer, x = linear_layer(), torch.randn(5, 64)
    original = layer.weight
    vllm_layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight is not original and layer.weight.numel() == 0

    layer = linear_layer()
    vllm_layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    before = layer.cpu_linear(x, layer.weight, None)
    layer.weight.data.mul_(2.0)
    assert torch.allclose(layer.cpu_linear(x, layer.weight, None), before)  # stale: the update never arrives


@pytest.mark.parametrize("remove_weight", [True, False])
def test_the_shim_keeps_the_parameter_and_computes_with_its_current_value(remove_weight):
    layer, x = linear_layer(), torch.randn(5, 64)
    original = layer.weight
    _keep_live_weight(vllm_layer_utils.dispatch_cpu_unquantized_gemm)(layer, remove_weight=remove_weight)
    assert layer.weight is original
    before = layer.cpu_linear(x, layer.weight, None)
    assert torch.allclose(before, x @ original.detach().T)
    layer.weight.data.mul_(2.0)  # what a weight sync does: write into the same Parameter
    assert torch.allclose(layer.cpu_linear(x, layer.weight, None), 2.0 * before)


def args(**overrides):
    fields = dict(use_vllm=True, vllm_mode="colocate", bf16=False, fp16=False, model_init_kwargs=None)
    return SimpleNamespace(**{**fields, **overrides})


def test_the_shim_applies_only_around_a_colocated_engine_build():
    import trl.generation.vllm_generation as trl_vllm

    dispatch, build = vllm_layer_utils.dispatch_cpu_unquantized_gemm, trl_vllm.LLM
    for off in (args(use_vllm=False), args(vllm_mode="server")):
        with colocated_vllm_on_cpu(off, "some/model"):
            assert vllm_layer_utils.dispatch_cpu_unquantized_gemm is dispatch and trl_vllm.LLM is build
    with colocated_vllm_on_cpu(args(), "some/model"):
        assert vllm_layer_utils.dispatch_cpu_unquantized_gemm.original is dispatch and trl_vllm.LLM is not build
    assert vllm_layer_utils.dispatch_cpu_unquantized_gemm is dispatch and trl_vllm.LLM is build


def test_the_engine_gets_the_policys_dtype():
    module = torch.nn.Linear(2, 2).to(torch.bfloat16)
    assert engine_dtype(args(), "path") == "float32"  # TRL's default model_init_kwargs dtype
    assert engine_dtype(args(model_init_kwargs={"dtype": "bfloat16"}), "path") == "bfloat16"
    assert engine_dtype(args(model_init_kwargs={"dtype": torch.float16}), "path") == "float16"
    assert engine_dtype(args(model_init_kwargs={"dtype": "auto"}), "path") == "auto"
    assert engine_dtype(args(), module) == "bfloat16"
    assert engine_dtype(args(bf16=True), "path") == "bfloat16"
    assert engine_dtype(args(fp16=True), module) == "float16"
