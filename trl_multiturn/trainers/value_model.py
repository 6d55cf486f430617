"""The critic of `MultiTurnPPOTrainer`: a transformer backbone with a scalar head, one value per token.

The critic is a `transformers` token-classification model with one label (`AutoModelForTokenClassification`,
`num_labels=1`): its own backbone (not shared with the policy) and a linear `score` head. It saves and loads with
`save_pretrained` / `from_pretrained`, and takes a PEFT adapter like any other `transformers` model (the head is
then trained in full, as PEFT does for token-classification heads).

A new head starts at zero, so a new critic values every state at 0. A randomly initialised head on a language
model's hidden states (whose norms are large: the LM head expects them) gives values of the order of the rewards or
larger (-1.4 to 0.1 on the tiny test model, -0.47 on average in the credit benchmark, where returns are 0 or 1):
advantages then start as that noise, and the first optimizer steps also move the backbone through the random head,
swinging every value at once (+2.97 after one step in the benchmark). From zero, the first steps move only the head,
towards the mean return.
"""

from __future__ import annotations

import copy
import os
from contextlib import nullcontext

import torch
from torch import nn
from transformers import AutoModelForTokenClassification, PreTrainedModel

from .tree_attention import TREE_LAYOUT

CRITIC_DIR = "critic"
"""Sub-folder of every checkpoint (and of the final output) that holds the critic."""


def create_value_model(policy, value_model=None, *, peft_config=None, model_init_kwargs: dict | None = None):
    """The critic for `policy`.

    Args:
        policy: the policy as a path / Hub id, a `PreTrainedModel`, or a `PeftModel` (the critic then starts from
            its base model's weights).
        value_model: None to initialise the critic's backbone from the policy's weights (with a fresh scalar head);
            a path / Hub id of a checkpoint to load (a saved critic, or any backbone); or a ready `nn.Module` whose
            forward returns `.logits` of shape (B, L, 1).
        peft_config: a `peft.PeftConfig` to train the critic with an adapter (task type TOKEN_CLS is forced, so that
            the head is trained in full).
        model_init_kwargs: `from_pretrained` keyword arguments (dtype, attn_implementation, ...) when the critic is
            loaded from a path; a critic copied from a policy object takes that object's dtype.
    """
    if isinstance(value_model, nn.Module):
        critic = value_model
    elif value_model is not None or isinstance(policy, str):
        critic = _from_pretrained(value_model if value_model is not None else policy, model_init_kwargs)
    else:
        critic = _from_policy_object(policy)
        _zero_new_head(critic)
    if peft_config is not None:
        critic = _with_adapter(critic, peft_config)
    return critic


def _from_pretrained(path: str, model_init_kwargs: dict | None) -> PreTrainedModel:
    kwargs = dict(model_init_kwargs or {})
    kwargs.pop("device_map", None)  # the trainer places the critic
    dtype = kwargs.get("dtype", "float32")  # TRL's default for the policy
    kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    try:
        critic, info = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, output_loading_info=True,
                                                                       **kwargs)
    except ValueError as exc:
        raise ValueError(f"cannot build a critic from {path!r}: {exc}. Pass `value_model=` a path whose architecture "
                         "has a token-classification head, or a ready nn.Module.") from exc
    _zero_new_head(critic, set(info["missing_keys"]))  # a saved critic's head is loaded; a backbone's is new
    return critic


def _zero_new_head(critic: PreTrainedModel, new: set[str] | None = None) -> None:
    """Zero the head's parameters (those outside the backbone) that are newly initialised: the names in `new`, or
    all of them when `new` is None."""
    backbone = {id(p) for p in critic.base_model.parameters()}
    head = [p for name, p in critic.named_parameters() if id(p) not in backbone and (new is None or name in new)]
    with torch.no_grad(), gathered(head):  # whole under ZeRO-3, where from_pretrained partitions at load
        for param in head:
            param.zero_()


def _from_policy_object(policy) -> PreTrainedModel:
    """A critic whose backbone is a copy of the policy's; for a `PeftModel` policy, of its base model's weights
    (without the adapter: the critic does not start from what the policy's adapter has learned). Its config is a copy
    of the policy's, attention implementation included (prefix packing forwards both with one mask form)."""
    from accelerate.utils import is_peft_model

    peft = is_peft_model(policy)
    base = policy.get_base_model() if peft else policy
    config = copy.deepcopy(base.config)
    config.num_labels = 1
    try:
        critic = AutoModelForTokenClassification.from_config(config)
    except ValueError as exc:
        raise ValueError(f"{type(base).__name__} has no token-classification counterpart to serve as critic: "
                         f"pass `value_model=` a path or a ready nn.Module ({exc})") from exc
    state = base.base_model.state_dict()
    if peft:
        state = base_weights_of_adapted(state)
    try:
        critic.base_model.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"cannot copy the policy's backbone into a critic ({exc}); pass `value_model=` a path (e.g. "
                         "the base model's) or a ready critic module.") from exc
    return critic.to(dtype=base.dtype, device=base.device)


def base_weights_of_adapted(state: dict) -> dict:
    """The base model's weights inside the state dict of a model that PEFT adapted in place: the wrapped layers'
    `base_layer` / `original_module` weights under their original names, the adapters' own weights (`lora_*`,
    `modules_to_save`) dropped."""
    out = {}
    for name, tensor in state.items():
        if "lora_" in name or ".modules_to_save." in name:
            continue
        out[name.replace(".base_layer.", ".").replace(".original_module.", ".")] = tensor
    return out


def _with_adapter(critic, peft_config):
    from peft import TaskType, get_peft_model

    peft_config = copy.deepcopy(peft_config)
    peft_config.task_type = TaskType.TOKEN_CLS
    return get_peft_model(critic, peft_config)


def token_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """(B, logits_to_keep) values V(s_t) of the last `logits_to_keep` tokens, where s_t is everything before token t:
    the head's output at position t - 1 (so a token's value never sees the token itself)."""
    out = critic(input_ids=input_ids, attention_mask=attention_mask)
    return out.logits[:, -logits_to_keep - 1:-1, 0].float()


class PolicyAndValueModel(nn.Module):
    """The policy and its critic as one module: the model `MultiTurnPPOTrainer` trains, prepares (DDP, FSDP,
    DeepSpeed), optimizes and checkpoints, so that one optimizer, one backward and one checkpoint cover both.

    TRL and transformers use the trainer's model as the policy (generation, its config, adapters, log-probs):
    every attribute this module does not define is the policy's, and `forward` is the policy's unless asked for
    values. Under FSDP2 every forward must go through this module (the root), so the values have one too:

        forward(..., output="policy")  -> the policy's output (TRL's keywords passed through)
        forward(input_ids, attention_mask, output="values") -> (B, L) the critic's head at every position
        forward(..., output="both")    -> (policy output, values) from one call: the PPO loss's

    The critic takes `input_ids`, `attention_mask` and, where given, `position_ids`: a packed forward's
    (`packing.model_inputs`: a prefix tree's position ids and 4-D mask) reaches both models alike. A forward
    continued from layer states (`packing_states.run_forks`) gives each model its own: `cache` the policy's,
    `critic_cache` the critic's (with `use_cache`).
    """

    def __init__(self, policy: nn.Module, critic: nn.Module):
        super().__init__()
        self.policy = policy
        self.critic = critic

    def forward(self, *args, output: str = "policy", critic_cache=None, **kwargs):
        if output == "policy":
            return self.policy(*args, **kwargs)
        values = self.critic(**{name: kwargs[name] for name in ("input_ids", "attention_mask", "position_ids",
                                                                TREE_LAYOUT) if name in kwargs},
                             **({} if critic_cache is None else {"cache": critic_cache,
                                                                 "use_cache": kwargs.get("use_cache")})).logits[..., 0]
        if output == "values":
            return values.float()
        return self.policy(*args, **kwargs), values.float()

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("policy"), name)

    # Both models follow the trainer's activation checkpointing (transformers and TRL switch it through these).
    def activation_checkpointing_enable(self, **kwargs):
        for model in (self.policy, self.critic):
            model.activation_checkpointing_enable(**kwargs)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        for model in (self.policy, self.critic):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self):
        for model in (self.policy, self.critic):
            model.gradient_checkpointing_disable()

    @staticmethod
    def split_state_dict(state_dict: dict) -> tuple[dict, dict]:
        """This module's state dict (e.g. gathered whole from its shards) as (the policy's, the critic's)."""
        return tuple({name.removeprefix(prefix): tensor for name, tensor in state_dict.items()
                      if name.startswith(prefix)} for prefix in ("policy.", "critic."))


def save_value_model(critic, output_dir: str, state_dict: dict | None = None) -> None:
    """Save the critic (full weights, or the adapter and head of a PEFT critic) to `output_dir/critic`;
    `state_dict`: its full weights when they are sharded across processes (gathered by the caller)."""
    critic.save_pretrained(os.path.join(output_dir, CRITIC_DIR), state_dict=state_dict)


def load_value_model_weights(critic, checkpoint_dir: str) -> None:
    """Load the weights saved by `save_value_model` into `critic`, in place (the optimizer keeps its parameters)."""
    from accelerate.utils import is_peft_model

    folder = os.path.join(checkpoint_dir, CRITIC_DIR)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{checkpoint_dir} has no {CRITIC_DIR}/ folder: it was not written by "
                                "MultiTurnPPOTrainer, or the critic was not saved with it")
    if is_peft_model(critic):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(critic, load_file(os.path.join(folder, "adapter_model.safetensors")))
    else:
        # from_pretrained reads any layout save_pretrained writes (one file or shards); its weights are then copied
        saved = type(critic).from_pretrained(folder, dtype=critic.dtype)
        critic.load_state_dict(saved.state_dict())


def gathered(params):
    """Under ZeRO-3 (parameters partitioned at load: `ds_id` set), a context in which `params` are whole, modified
    on rank 0 and partitioned again on exit; otherwise a context that does nothing."""
    params = list(params)
    if not any(hasattr(p, "ds_id") for p in params):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)
