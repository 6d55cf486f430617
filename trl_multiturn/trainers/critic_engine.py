"""The PPO critic under DeepSpeed: a ZeRO engine of its own, next to the policy's.

Under DDP and FSDP the critic's parameters are extra groups of the policy's optimizer (`ppo.py`). A DeepSpeed
engine's ZeRO optimizer partitions and reduces the gradients of its own model's parameters only, and accelerate
keeps one engine for `accelerator.backward`, so the critic gets a second engine, as TRL's former PPOTrainer and
OpenRLHF train theirs:

- its config is the policy's, once transformers has filled the `auto` values (same ZeRO stage, micro-batch size,
  gradient accumulation, clipping and precision); the `optimizer` and `scheduler` blocks are dropped because the
  trainer builds the critic's own (its learning rate, the trainer's `lr_scheduler_type`), and ZeRO-3 gathers whole
  weights when the critic is saved;
- the value loss takes its own backward on that engine, scaled as the policy's is (the trainer already divides by
  the accumulation steps: `scale_wrt_gas=False`), and the engine steps when the policy's does;
- checkpoints hold the engine's own state (weights, partitioned optimizer state, scheduler) in `critic_deepspeed/`
  beside TRL's, and a resumed run loads it back.
"""

from __future__ import annotations

import copy
import os
from contextlib import nullcontext

from torch import nn

CRITIC_ENGINE_DIR = "critic_deepspeed"
"""Sub-folder of each checkpoint that holds the critic engine's DeepSpeed checkpoint (for resuming)."""


def critic_deepspeed_config(policy_config: dict) -> dict:
    """The critic's DeepSpeed config: the policy's (auto values filled), without its optimizer and scheduler blocks;
    a torch optimizer is allowed (also with optimizer offload), and ZeRO-3 gathers whole weights for saving."""
    config = copy.deepcopy(policy_config)
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    config["zero_allow_untested_optimizer"] = True
    config["zero_force_ds_cpu_optimizer"] = False
    zero = config.setdefault("zero_optimization", {})
    if zero.get("stage", 0) == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return config


def start_critic_engine(critic: nn.Module, optimizer, lr_scheduler, policy_config: dict):
    """`critic` wrapped in a DeepSpeed engine that owns `optimizer` and `lr_scheduler`."""
    import deepspeed

    engine, *_ = deepspeed.initialize(model=critic, optimizer=optimizer, lr_scheduler=lr_scheduler,
                                      config=critic_deepspeed_config(policy_config))
    return engine


def is_engine(module) -> bool:
    from accelerate.utils import is_deepspeed_available

    if not is_deepspeed_available():
        return False
    from deepspeed import DeepSpeedEngine

    return isinstance(module, DeepSpeedEngine)


def engine_backward(engine, loss, sync_gradients: bool) -> None:
    """Backward of `loss` (already divided by the accumulation steps) on the critic's engine, then its optimizer
    step on the micro-batch where the policy's engine steps (accelerate's own engine wrapper does both)."""
    from accelerate.utils import DeepSpeedEngineWrapper

    DeepSpeedEngineWrapper(engine).backward(loss, sync_gradients=sync_gradients, scale_wrt_gas=False)


def save_engine_state(engine, output_dir: str) -> None:
    """The engine's DeepSpeed checkpoint in `output_dir/critic_deepspeed` (every process writes its partition)."""
    engine.save_checkpoint(os.path.join(output_dir, CRITIC_ENGINE_DIR))


def load_engine_state(engine, checkpoint_dir: str) -> None:
    folder = os.path.join(checkpoint_dir, CRITIC_ENGINE_DIR)
    path, _ = engine.load_checkpoint(folder) if os.path.isdir(folder) else (None, None)
    if path is None:
        raise FileNotFoundError(f"{checkpoint_dir} has no DeepSpeed checkpoint of the critic in {CRITIC_ENGINE_DIR}/: "
                                "it was not written by MultiTurnPPOTrainer under DeepSpeed; resume it with the "
                                "backend that wrote it")


def gathered(params):
    """Under ZeRO-3 (parameters partitioned at load: `ds_id` set), a context in which `params` are whole, modified
    on rank 0 and partitioned again on exit; otherwise a context that does nothing."""
    params = list(params)
    if not any(hasattr(p, "ds_id") for p in params):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)
