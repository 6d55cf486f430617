"""Prefix-tree packing with sliding-window layers narrower than the rows (Gemma 3, Gemma 4, GPT-OSS): one mask per
layer type, the sliding layers' mask cut to the window by tree depth. Exact against per-row forwards with no padding
(log-probs, entropies) and against the padded rows (the same, and the gradients), on tiny in-process configs."""

import copy
import random

import pytest
import torch
from test_packing import ATOL, TEMPERATURE, assert_exact, batch, tokens
from test_ppo_packing import assert_policy_and_values_exact
from transformers import (
    AutoModelForTokenClassification,
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    SiglipVisionConfig,
)

from trl_multiturn.trainers.logprobs import token_logps_and_entropies
from trl_multiturn.trainers.packing import choose_plan, packed_logps_and_entropies, packing_refusal, window_mask
from trl_multiturn.trainers.value_model import PolicyAndValueModel

WINDOW = 8
SHARED = dict(vocab_size=500, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, sliding_window=WINDOW, initializer_range=0.2, pad_token_id=0)
GEMMA3 = dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"])
# Gemma 4 as its small checkpoints are built: per-layer inputs, wider full-attention heads, the last layers reusing
# earlier layers' keys and values, keys as values on the full layers
GEMMA4 = dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
              hidden_size_per_layer_input=16, vocab_size_per_layer_input=500, global_head_dim=32,
              attention_k_eq_v=True, num_global_key_value_heads=1)
FAMILIES = {
    "gemma3": lambda attn: Gemma3ForCausalLM(Gemma3TextConfig(**SHARED, **GEMMA3, attn_implementation=attn)),
    "gemma4": lambda attn: Gemma4ForCausalLM(Gemma4TextConfig(**SHARED, **GEMMA4, attn_implementation=attn)),
    "gpt_oss": lambda attn: GptOssForCausalLM(GptOssConfig(
        **SHARED, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], num_local_experts=4,
        num_experts_per_tok=2, attn_implementation=attn)),
    # the image-text models (how Gemma 3 from 4B and Gemma 4 load), on text rows; the vision tower frozen
    "gemma3_vlm": lambda attn: Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=Gemma3TextConfig(**SHARED, **GEMMA3), mm_tokens_per_image=4, attn_implementation=attn,
        vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, image_size=28, patch_size=14))),
    "gemma4_vlm": lambda attn: Gemma4ForConditionalGeneration(Gemma4Config(
        text_config=Gemma4TextConfig(**SHARED, **GEMMA4), vision_config=None, audio_config=None,
        attn_implementation=attn)),
}
CASES = [("gemma3", "sdpa"), ("gemma3", "eager"), ("gemma4", "sdpa"), ("gemma4", "eager"),
         ("gpt_oss", "eager"),  # GPT-OSS has no SDPA kernel in transformers (its attention sinks)
         ("gemma3_vlm", "sdpa"), ("gemma4_vlm", "sdpa")]


def build(family, attn):
    torch.manual_seed(0)
    model = FAMILIES[family](attn).float()
    for name, param in model.named_parameters():
        param.requires_grad_("vision" not in name and "multi_modal" not in name)
    return model


def rows_around_the_window():
    """A GRPO-like group over one 18-token prompt (rows of ~30 tokens, well past the window) and a group whose rows
    end one below, at and one above the window (2-token prompt; replies of WINDOW - 3 to WINDOW - 1 tokens)."""
    rng = random.Random(3)
    prompt = tokens(rng, 18)
    long = [(prompt, tokens(rng, n)) for n in (12, 9, 14)]
    long.append((prompt, long[0][1][:4] + tokens(rng, 6)))
    short_prompt = tokens(rng, 2)
    return long + [(short_prompt, tokens(rng, n)) for n in (WINDOW - 3, WINDOW - 2, WINDOW - 1)]


def per_row(model, rows):
    """(logps, entropies) (B, K) of each row forwarded alone, unpadded: the exact reference."""
    keep = max(len(c) for _, c in rows)
    logps, entropies = torch.zeros(len(rows), keep), torch.zeros(len(rows), keep)
    with torch.no_grad():
        for b, (p, c) in enumerate(rows):
            ids = torch.tensor([p + c])
            logits = model(input_ids=ids, use_cache=False).logits[:, len(p) - 1:-1]
            lp, ent = token_logps_and_entropies(logits, ids[:, len(p):], TEMPERATURE, True)
            logps[b, :len(c)], entropies[b, :len(c)] = lp[0], ent[0]
    return logps, entropies


@pytest.mark.parametrize(("family", "attn"), CASES)
def test_sliding_layers_pack_exactly_past_the_window(family, attn):
    model = build(family, attn)
    rows = rows_around_the_window()
    ids, mask, keep = batch(rows)
    assert packing_refusal(model, ids.shape[1]) is None
    assert choose_plan((model,), ids, mask, keep, packing="auto") is not None  # "auto" packs them
    plan = assert_exact(model, rows)  # packed vs padded: log-probs, entropies, gradients
    assert plan.forwarded_tokens < plan.padded_tokens - 17 * 3  # the prompt forwarded once: packed, not padded
    with torch.no_grad():
        packed = packed_logps_and_entropies(model, ids, mask, keep, compute_entropy=True, temperature=TEMPERATURE,
                                            packing="prefix")
    expected = per_row(model, rows)
    for got, want in zip(packed, expected, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # the window matters here: the same rows seen whole (no window) are far from the reference
    model.config.get_text_config().sliding_window = 10**6
    unwindowed = per_row(model, rows)[0]
    assert (unwindowed - expected[0])[:4].abs().max() > 1e-2


def test_ppo_policy_and_critic_pack_exactly_past_the_window():
    """PPO's loss forward of a GPT-OSS policy and its token-classification critic (the critic a config copy, as
    `value_model.create_value_model` builds it): one packed forward of each, values and gradients as padded."""
    policy = build("gpt_oss", "eager")
    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    critic = AutoModelForTokenClassification.from_config(config).eval()  # eval: no dropout before its head
    plan = assert_policy_and_values_exact(PolicyAndValueModel(policy, critic), rows_around_the_window())
    assert plan.forwarded_tokens < plan.padded_tokens


def test_window_mask_keeps_the_token_and_the_window_minus_one_before_it():
    """transformers' convention (`sliding_window_overlay`: kv > q - W): W keys, the query's own included."""
    chain = torch.tril(torch.ones(1, 1, 6, 6, dtype=torch.bool))
    got = window_mask(chain, torch.arange(6)[None], 3)
    expected = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                             [0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(got[0, 0], expected)


def test_other_sliding_families_still_refuse_by_name():
    """A family outside WINDOWED_FAMILIES takes one 4-D mask, which carries no window: refused past the window; and
    a policy and critic of which one takes a mask per layer type and the other one mask cannot share a mask form."""
    model = MistralForCausalLM(MistralConfig(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW,
                                             attn_implementation="sdpa"))
    assert packing_refusal(model, WINDOW) is None
    refusal = packing_refusal(model, WINDOW + 1)
    assert "mistral" in refusal and "sliding_attention" in refusal and "packing='padded'" in refusal
    ids, mask, keep = batch([([5, 6], [7, 8, 9])] * 2)  # rows within the window: each model alone packs them
    with pytest.raises(ValueError, match="'gemma3_text', 'mistral'.*packing='padded'"):
        choose_plan((build("gemma3", "sdpa"), model), ids, mask, keep, packing="prefix")
