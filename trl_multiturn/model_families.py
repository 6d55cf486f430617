"""The model families the conformance matrix checks (docs/models.md), each as a tiny random model of its
transformers config class with its chat template as TRL ships it and a tokenizer built in-process with the
template's special tokens: nothing from the Hub.

`FAMILIES` is the one table of them; `build_model(family)` and `build_tokenizer(family)` make a family's model and
tokenizer, `build_critic(model)` a PPO critic of its family; `scripts/model_matrix.py` runs the matrix over them and
writes docs/models.md, `scripts/gpu_check.sh` runs its GPU column, and `tests/test_model_families.py` holds the library
to it. A family is a shape (its layer types, attention and template), not a checkpoint: the sizes are the smallest that
keep each layer type (2-4 layers, hidden size 64, a vocabulary of a few hundred tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHATML = {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>",
          "extra": ["<|im_start|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]}
"""The special tokens of the ChatML templates (Qwen, Nemotron, LFM2 and the templates borrowed for families TRL
ships none for)."""


@dataclass(frozen=True)
class Family:
    """One model family of the matrix.

    `config_class` (a transformers config class name) with `options` over the shared tiny sizes (`TINY`) builds its
    model with `AutoModelForCausalLM.from_config`; `template` is the TRL chat template file (its training version,
    which keeps earlier turns as they were rendered, where TRL ships one); `tokens` its special tokens (bos, eos,
    pad, extra); `attn` the attention implementation it loads with (GPT-OSS's attention sinks have no SDPA path);
    `note` what the table says about a borrowed template or a missing feature."""

    name: str
    config_class: str
    options: dict = field(default_factory=dict)
    template: str = "qwen2_5_training.jinja"
    tokens: dict = field(default_factory=lambda: CHATML)
    attn: str = "sdpa"
    note: str = ""


TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.2)
"""The sizes every family shares (a family's `options` override them; None removes one)."""

_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
_BORROWED = "borrowed: TRL ships no template for the family"

FAMILIES: tuple[Family, ...] = (
    Family("Llama (SmolLM2)", "LlamaConfig", template="llama3.jinja",
           tokens={"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|finetune_right_pad_id|>",
                   "extra": ["<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"]}),
    Family("Qwen3", "Qwen3Config", template="qwen3_training.jinja"),
    Family("Qwen3-MoE", "Qwen3MoeConfig", {**_MOE, "num_experts": 4}, template="qwen3_instruct_2507_training.jinja"),
    Family("Qwen3.5", "Qwen3_5TextConfig",
           dict(layer_types=["linear_attention", "full_attention"] * 2, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4),
           template="qwen3_5_nothink_training.jinja"),
    Family("Qwen3-Next", "Qwen3NextConfig",
           dict(_MOE, layer_types=["linear_attention", "full_attention"] * 2, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
                shared_expert_intermediate_size=32),
           template="qwen3_instruct_2507_training.jinja"),
    Family("LFM2", "Lfm2Config", dict(layer_types=["conv", "full_attention"] * 2), template="lfm2_training.jinja",
           tokens={**CHATML, "bos": "<|startoftext|>", "pad": "<|pad|>",
                   "extra": [*CHATML["extra"], "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_response_start|>",
                             "<|tool_response_end|>"]}),
    Family("Nemotron-H", "NemotronHConfig",
           dict(layers_block_type=["mamba", "attention", "mamba", "moe"], mamba_num_heads=4, mamba_head_dim=16,
                n_groups=1, ssm_state_size=16, chunk_size=16, n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, moe_shared_expert_intermediate_size=32),
           template="nemotron_3_nano_training.jinja"),
    Family("Falcon-H1", "FalconH1Config",
           dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16),
           note=_BORROWED),
    Family("GraniteMoeHybrid", "GraniteMoeHybridConfig",
           dict(layer_types=["mamba", "attention"] * 2, mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16,
                mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32),
           note=_BORROWED),
    Family("Gemma 3", "Gemma3TextConfig", dict(sliding_window=16), template="gemma3_training.jinja",
           tokens={"bos": "<bos>", "eos": "<end_of_turn>", "pad": "<pad>", "extra": ["<start_of_turn>"]}),
    Family("Gemma 4", "Gemma4TextConfig",
           dict(sliding_window=16, hidden_size_per_layer_input=16, vocab_size_per_layer_input=1024),
           template="gemma4.jinja",
           tokens={"bos": "<bos>", "eos": "<turn|>", "pad": "<pad>",
                   "extra": ["<|turn>", '<|"|>', "<|think|>", "<|channel>", "<channel|>", "<|tool_call>",
                             "<tool_call|>", "<|tool_response>", "<tool_response|>", "<|tool>", "<tool|>"]},
           note="TRL ships no training version of its template"),
    Family("GPT-OSS", "GptOssConfig", dict(sliding_window=16, num_local_experts=4, num_experts_per_tok=2),
           template="gptoss_training.jinja", attn="eager",
           tokens={"bos": None, "eos": "<|return|>", "pad": "<|endoftext|>",
                   "extra": ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|constrain|>"]}),
    Family("GLM-4 MoE", "Glm4MoeConfig",
           dict(_MOE, n_routed_experts=4, first_k_dense_replace=1, n_group=1, topk_group=1),
           template="glm4moe_training.jinja",
           tokens={"bos": None, "eos": "<|user|>", "pad": "<|endoftext|>",
                   "extra": ["[gMASK]", "<sop>", "<|system|>", "<|assistant|>", "<|observation|>", "<think>",
                             "</think>", "<tool_call>", "</tool_call>"]}),
    Family("SmolLM3", "SmolLM3Config", note=_BORROWED),
    Family("DeepSeek-V3", "DeepseekV3Config",
           dict(_MOE, head_dim=None, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                v_head_dim=16, qk_nope_head_dim=8, n_routed_experts=4, first_k_dense_replace=1, n_group=1,
                topk_group=1),
           template="deepseekv3_training.jinja",
           tokens={"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>", "pad": "<｜pad｜>",
                   "extra": ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>",
                             "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
                             "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                             "<｜tool▁output▁end｜>"]}),
    Family("OLMo 3", "Olmo3Config", dict(sliding_window=16), note=_BORROWED),
    Family("Phi-4 (mini)", "Phi3Config", template="phi3_5_training.jinja",
           tokens={"bos": None, "eos": "<|end|>", "pad": "<|endoftext|>",
                   "extra": ["<|system|>", "<|user|>", "<|assistant|>"]}),
)

NOT_IN_TRANSFORMERS: tuple[str, ...] = ()
"""Families of issue 59 that the installed transformers cannot build (none in 5.25)."""


def family(name: str) -> Family:
    """The family called `name` (a ValueError naming the choices otherwise)."""
    for fam in FAMILIES:
        if fam.name == name:
            return fam
    raise ValueError(f"model family {name!r}: choose one of {[fam.name for fam in FAMILIES]}")


def build_tokenizer(fam: Family):
    """A byte-level BPE tokenizer trained in-process with `fam`'s special tokens and TRL's chat template."""
    from .testing import train_tiny_tokenizer, trl_chat_template

    tokenizer = train_tiny_tokenizer(fam.tokens, trl_chat_template(fam.template))
    tokenizer.name_or_path = fam.name  # what refusals call it
    return tokenizer


def tiny_config(fam: Family, tokenizer=None, **overrides):
    """`fam`'s tiny transformers config: `TINY` with its options and `overrides` (None removes a field), its
    vocabulary and special token ids those of `tokenizer` (default `build_tokenizer(fam)`)."""
    import transformers

    tokenizer = tokenizer if tokenizer is not None else build_tokenizer(fam)
    fields = {**TINY, **fam.options, **overrides,
              "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
              "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    return getattr(transformers, fam.config_class)(**{k: v for k, v in fields.items() if v is not None})


def build_model(fam: Family, tokenizer=None, *, dtype=None, attn: str | None = None, seed: int = 0, **overrides):
    """`fam`'s tiny random causal LM (float32 unless `dtype`; `fam.attn` unless `attn`), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(fam, tokenizer, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32,
                                             attn_implementation=attn or fam.attn)
    return model.eval()


def build_critic(policy, *, seed: int = 2, head_std: float = 0.5):
    """A tiny random critic for `policy` (one of `build_model`'s), a token-classification model of its family with
    one label and its own weights: transformers' class where it has one, else the class transformers builds for other
    families (`GenericForTokenClassification`) over the family's model (Qwen3.5, LFM2 and the Mamba2 families have
    none): the critic a user passes PPO as `value_model=`. Its head is random (normal, `head_std`; a new one would
    value every state at 0) and its dropout off (as the PPO trainer turns it off)."""
    import torch
    from transformers import AutoModelForTokenClassification, PreTrainedModel
    from transformers.modeling_layers import GenericForTokenClassification

    config = policy.config.__class__.from_dict({**policy.config.to_dict(), "num_labels": 1})
    torch.manual_seed(seed)
    try:
        critic = AutoModelForTokenClassification.from_config(config)
    except ValueError:  # no token-classification class for the family
        # the family's PreTrainedModel (e.g. Qwen3_5PreTrainedModel): its weight initialisation and cache classes
        pretrained = next(c for c in type(policy).__mro__[1:] if issubclass(c, PreTrainedModel))
        critic_class = type(type(policy).__name__.replace("ForCausalLM", "ForTokenClassification"),
                            (GenericForTokenClassification, pretrained), {})
        critic = critic_class(config)
    torch.nn.init.normal_(critic.score.weight, std=head_std)
    return critic.to(policy.dtype).eval()
