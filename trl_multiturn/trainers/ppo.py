"""`MultiTurnPPOTrainer`: PPO with a critic over multi-turn episodes, built on TRL's GRPO machinery.

TRL 1.16 has no PPO trainer. This one reuses `MultiTurnGRPOTrainer` end to end (rollouts through the trainer's
generation backend, vLLM included; TRL's clipped surrogate on (B, T) advantages masked by env_mask; multiple PPO
epochs through `num_iterations` and mini-batches through `steps_per_generation`) and adds:

- a critic (`value_model.py`): its own backbone with a scalar head (a new head starts at zero), initialised from
  the policy or a given path, optionally with a PEFT adapter;
- per-token rewards: each turn's reward on its last sampled token, minus `kl_coef` * (log pi_old - log pi_ref) on
  every sampled token (the KL penalty folded into the reward, the paper's setting); GRPO's `beta` still adds the
  KL as a loss term if set;
- advantages and value targets from a value estimator of `credit.gae` (GAE over the sampled tokens by default,
  observation tokens skipped), whitened over the batch's sampled tokens;
- the clipped value loss, weighted by `vf_coef`, added to the policy loss.

Design choices:

- One optimizer. The critic's parameters are extra parameter groups of the trainer's optimizer (learning rate
  `critic_learning_rate`, default `learning_rate`), so TRL's scheduler, gradient accumulation and optimizer
  checkpointing cover it with no second loop. Its gradients are clipped to `max_grad_norm` on their own, and
  cleared wherever the training loop clears the policy's (`_ClearCriticGradients`).
- Checkpoints: every checkpoint (and the final `save_model`) holds the policy as TRL writes it plus the critic in
  a `critic/` sub-folder (`save_pretrained` layout); `resume_from_checkpoint` loads it back into the critic, and the
  critic's optimizer state comes back with the trainer's `optimizer.pt`.
- The critic's dropout is always off: value targets and value clipping assume the critic is deterministic.
- Scaling out: the critic is prepared as the policy is: DDP, or sharded by FSDP2 before the optimizer exists, its
  groups then joining the optimizer after accelerate has swapped in the policy's shards (tested on 2 CPU processes);
  FSDP1 goes through `prepare_model` and is untested (accelerate's FSDP1 plugin refuses CPU). Under DeepSpeed
  (ZeRO-2/3) the critic is a second engine with its own optimizer and scheduler (`critic_engine.py`): a ZeRO
  engine's optimizer covers its own model's parameters only. Tested on 2 CPU processes with DeepSpeed's CPU
  accelerator (DeepSpeed 0.19.8, torch 2.13.0+cpu, accelerate 1.15.0, gloo, `use_cpu=True`: without it, on a
  machine with no accelerator, accelerate's state finds no backend and counts one process while DeepSpeed's group
  spans all ranks).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import TrainerCallback, set_seed
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import disable_dropout_in_model

from ..config_checks import Range, check_fields
from ..credit.gae import ValueBatch, get_value_estimator, masked_moments, masked_whiten
from ..rollout.batch import RolloutBatch
from . import critic_engine
from .grpo import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from .multiturn import default_args
from .value_model import create_value_model, load_value_model_weights, save_value_model, token_values


class _GroupOfOne(int):
    """`num_generations=1` while `GRPOConfig.__post_init__` runs: it refuses groups of one, which GRPO's baseline
    needs and PPO (whose baseline is the critic) does not. Every other check sees the plain value 1."""

    def __lt__(self, other):
        return False


@dataclass
class MultiTurnPPOConfig(MultiTurnGRPOConfig):
    """`GRPOConfig` + the multi-turn fields + PPO's critic, GAE and KL-in-reward fields.

    GRPO fields keep their meaning: `epsilon` clips the policy ratio, `num_iterations` is the number of PPO epochs
    over one batch of episodes, `steps_per_generation` the number of mini-batches, `beta` an optional KL *loss*
    term. `num_generations` (episodes per task) defaults to 1.
    """

    num_generations: int | None = field(
        default=1,
        metadata={"help": "Episodes played per task in a batch. PPO's baseline is the critic, so 1 is allowed."},
    )
    advantage_estimator: str = field(
        default="gae",
        metadata={"help": "Value-based estimator in `trl_multiturn.credit.gae.VALUE_ESTIMATORS`: 'gae' (token "
                          "level: every sampled token is a step, observation tokens are skipped) or 'turn_gae' "
                          "(each turn is a step, valued at its first token)."},
    )
    gamma: float = field(default=1.0, metadata={"help": "GAE discount per step (the paper: 1.0)."})
    lam: float = field(default=1.0, metadata={"help": "GAE lambda (the paper: 1.0)."})
    kl_coef: float = field(
        default=0.05,
        metadata={"help": "Coefficient of the KL penalty folded into the per-token reward: r_t -= kl_coef * "
                          "(log pi_old - log pi_ref) on every sampled token. 0 disables it (and, with beta=0, the "
                          "reference model)."},
    )
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss in the total loss."})
    cliprange_value: float = field(
        default=0.2,
        metadata={"help": "The critic's new values are clipped to old value +- cliprange_value in the clipped "
                          "value loss."},
    )
    whiten_advantages: bool = field(
        default=True,
        metadata={"help": "Normalise advantages to mean 0 and std 1 over the sampled tokens of the batch (all "
                          "processes)."},
    )
    value_model: str | None = field(
        default=None,
        metadata={"help": "Path or Hub id of the critic's initial weights (a saved critic or any backbone). None: "
                          "the critic's backbone starts as a copy of the policy's. A new scalar head starts at zero "
                          "(every value 0 until the critic has seen returns)."},
    )
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the critic's parameters. None: `learning_rate`."}
    )

    _RANGES = {
        "num_generations": Range(ge=1, text="an integer >= 1 (episodes per task; PPO allows 1), or None"),
        "gamma": Range(ge=0, le=1),
        "lam": Range(ge=0, le=1),
        "kl_coef": Range(ge=0),
        "vf_coef": Range(ge=0),
        "cliprange_value": Range(gt=0),
        "critic_learning_rate": Range(gt=0, text="a number > 0, or None for `learning_rate`"),
    }

    def __post_init__(self):
        check_fields(self)  # before the swap below, which would take num_generations=True for 1
        single = self.num_generations == 1
        if single:
            self.num_generations = _GroupOfOne(1)
        try:
            super().__post_init__()
        finally:
            if single:
                self.num_generations = 1

    def check_advantage_estimator(self) -> None:
        get_value_estimator(self.advantage_estimator)

    def unused_fields(self) -> dict[str, str]:
        return {
            **super().unused_fields(),
            "turn_gamma": "PPO discounts with its value estimator's gamma and lam: set gamma",
            "estimator_kwargs": "PPO's value estimators take gamma and lam: set those fields",
            "scale_rewards": "PPO normalises its advantages with whiten_advantages",
        }


def clipped_value_loss(values, old_values, returns, mask, cliprange_value: float):
    """PPO's clipped value loss over the positions where `mask` is True:

        V_clip = V_old + clamp(V - V_old, -c, c)
        L_V = 1/2 * mean_t max((V_t - R_t)^2, (V_clip_t - R_t)^2)

    Returns (L_V, the fraction of positions whose value moved by more than c).
    """
    mask = mask.to(values.dtype)
    clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    error = torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    count = mask.sum().clamp(min=1.0)
    loss = 0.5 * (error * mask).sum() / count
    clip_fraction = (((values - old_values).abs() > cliprange_value).to(values.dtype) * mask).sum() / count
    return loss, clip_fraction


def shard_with_fsdp2(accelerator, critic: nn.Module) -> nn.Module:
    """The critic sharded as accelerate shards the policy under FSDP2 (its plugin's wrap policy and settings),
    before any optimizer holds its parameters."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    accelerator.state.fsdp_plugin.set_auto_wrap_policy(critic)
    return fsdp2_prepare_model(accelerator, critic)


def active_peft_config(model):
    """The active adapter's `PeftConfig` of a `PeftModel` policy (a LoRA policy gets a LoRA critic); else None."""
    from accelerate.utils import is_peft_model

    return model.peft_config[model.active_adapter] if isinstance(model, nn.Module) and is_peft_model(model) else None


class _ClearCriticGradients(TrainerCallback):
    """Clears the critic's gradients wherever the training loop clears the policy's.

    The loop calls `model.zero_grad()` on the policy only: when training begins and after each optimizer step. The
    critic's parameters are in the same optimizer, so without this each step would apply the sum of every critic
    gradient since training began. `on_optimizer_step` runs once per optimizer step, after `optimizer.step()` and
    before the next step's first backward, so the micro-batches of one step still accumulate."""

    def __init__(self, critic: nn.Module):
        self.critic = critic

    def on_train_begin(self, args, state, control, **kwargs):
        self.critic.zero_grad(set_to_none=True)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.critic.zero_grad(set_to_none=True)


class MultiTurnPPOTrainer(MultiTurnGRPOTrainer):
    """PPO with a critic over multi-turn episodes.

    Same arguments as `MultiTurnGRPOTrainer`, plus:
        value_model: the critic as a ready module (forward returning `.logits` of shape (B, L, 1)) or a path;
            overrides `args.value_model`. None: a critic initialised from the policy.
        value_peft_config: a `peft.PeftConfig` for the critic; defaults to `peft_config`, or to the adapter's config
            of a `PeftModel` policy (a LoRA policy gets a LoRA critic). A `PeftModel` policy's critic starts from
            its base model's weights.
    """

    _tag_names = ["trl", "ppo", "trl-multiturn"]

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: MultiTurnPPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        environment_factory=None,
        value_model: str | nn.Module | None = None,
        value_peft_config=None,
    ):
        if args is None:
            args = default_args(MultiTurnPPOConfig, model)
        if not isinstance(args, MultiTurnPPOConfig):
            raise TypeError(f"args must be a MultiTurnPPOConfig, got {type(args).__name__}")
        if optimizers[0] is not None:
            raise ValueError("MultiTurnPPOTrainer builds one optimizer for the policy and the critic: leave "
                             "optimizers=(None, None) and set learning_rate / critic_learning_rate / optim.")
        set_seed(args.seed)
        critic = create_value_model(
            model, value_model if value_model is not None else args.value_model,
            peft_config=next((c for c in (value_peft_config, peft_config, active_peft_config(model))
                              if c is not None), None),
            model_init_kwargs=args.model_init_kwargs,
        )
        # TRL builds a reference model only for beta != 0 (from the policy object: `MultiTurnGRPOTrainer`); PPO also
        # needs one for the KL folded into the reward.
        loss_beta = args.beta
        needs_reference = args.kl_coef != 0.0 or loss_beta != 0.0
        args.beta = loss_beta if loss_beta != 0.0 or not needs_reference else 1.0
        try:
            super().__init__(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                reward_processing_classes=reward_processing_classes,
                callbacks=callbacks,
                optimizers=optimizers,
                quantization_config=quantization_config,
                peft_config=peft_config,
                environment_factory=environment_factory,
            )
        finally:
            args.beta = loss_beta
        self.beta = loss_beta
        self._critic_loss = None  # under DeepSpeed: the value loss awaiting its backward on the critic's engine
        self._init_critic(critic)

    def _init_critic(self, critic: nn.Module) -> None:
        disable_dropout_in_model(critic)  # value targets and value clipping assume deterministic values
        if self.args.gradient_checkpointing:
            kwargs = self.args.gradient_checkpointing_kwargs or {"use_reentrant": False}
            critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if self.is_deepspeed_enabled:
            self.critic = critic  # becomes its own engine once the training steps are known (`create_scheduler`)
            return
        if self._fsdp2:
            self.critic = shard_with_fsdp2(self.accelerator, critic)
        else:
            self.critic = self.accelerator.prepare_model(critic)  # DDP, FSDP1 or one device, as the policy
        self.add_callback(_ClearCriticGradients(self.critic))

    @property
    def _fsdp2(self) -> bool:
        return self.is_fsdp_enabled and getattr(self.accelerator.state.fsdp_plugin, "fsdp_version", 1) == 2

    @property
    def unwrapped_critic(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.critic)

    # -- optimisation -------------------------------------------------------------------------------------------------

    def create_optimizer(self, model=None):
        """The trainer's optimizer, with the critic's parameters as extra groups (decay / no decay). Under FSDP2
        the groups are added in `create_scheduler` instead: accelerate swaps every parameter of the optimizer it
        prepares for the policy's sharded ones, and would not find the critic's. Under DeepSpeed the critic has an
        optimizer of its own."""
        optimizer = super().create_optimizer(model)
        if not (self._fsdp2 or self.is_deepspeed_enabled):
            self._add_critic_param_groups(optimizer)
        return optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """TRL's scheduler over every group; runs right after the optimizer is prepared (and before a checkpoint's
        optimizer state is loaded), so under FSDP2 the critic's groups join the optimizer here, and under DeepSpeed
        the critic becomes its own engine here (in the call after accelerate has prepared the policy's engine: the
        one without `optimizer`; transformers' `deepspeed_init` may call this earlier, on a copy of the trainer)."""
        if self.is_deepspeed_enabled:
            if optimizer is None:
                self._start_critic_engine(num_training_steps)
        else:
            self._add_critic_param_groups(optimizer if optimizer is not None else self.optimizer)
        return super().create_scheduler(num_training_steps, optimizer)

    def _critic_param_groups(self, critic: nn.Module) -> list[dict]:
        """The critic's trainable parameters in two groups (weight decay / none) at `critic_learning_rate`."""
        lr = self.args.critic_learning_rate if self.args.critic_learning_rate is not None else self.args.learning_rate
        decay = set(self.get_decay_parameter_names(critic))
        named = [(n, p) for n, p in critic.named_parameters() if p.requires_grad]
        groups = (([p for n, p in named if n in decay], self.args.weight_decay),
                  ([p for n, p in named if n not in decay], 0.0))
        return [{"params": params, "lr": lr, "weight_decay": wd} for params, wd in groups if params]

    def _add_critic_param_groups(self, optimizer) -> None:
        critic = self.unwrapped_critic
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if any(id(p) in ids for p in critic.parameters()):
            return
        for group in self._critic_param_groups(critic):
            optimizer.add_param_group(group)

    def _start_critic_engine(self, num_training_steps: int) -> None:
        """The critic as a DeepSpeed engine of its own (`critic_engine.py`): the optimizer `optim` names, over
        `_critic_param_groups`, and the trainer's `lr_scheduler_type` schedule over `num_training_steps`."""
        if critic_engine.is_engine(self.critic):
            return
        from transformers import Trainer, get_scheduler

        optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, self.critic)
        optimizer = optimizer_cls(self._critic_param_groups(self.critic), **optimizer_kwargs)
        scheduler = get_scheduler(self.args.lr_scheduler_type, optimizer=optimizer,
                                  num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
                                  num_training_steps=num_training_steps,
                                  scheduler_specific_kwargs=self.args.lr_scheduler_kwargs)
        self.critic = critic_engine.start_critic_engine(self.critic, optimizer, scheduler,
                                                        self.accelerator.state.deepspeed_plugin.deepspeed_config)

    def training_step(self, model, inputs, num_items_in_batch=None):
        """TRL's step (the policy's backward, and its engine's step under DeepSpeed); under DeepSpeed, then the
        value loss's backward and step on the critic's engine."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._critic_loss is not None:
            critic_loss, self._critic_loss = self._critic_loss, None
            critic_engine.engine_backward(self.critic, critic_loss, self.accelerator.sync_gradients)
        return loss

    def _clip_grad_norm(self, model):
        norm = super()._clip_grad_norm(model)  # also unscales every group's gradients under fp16
        if self.is_deepspeed_enabled:  # its engine clipped it when it stepped, in `training_step`
            critic_norm = self.critic.get_global_grad_norm()
        else:  # accelerate's clipping takes the norm over all shards under FSDP (a sum of local norms would not)
            critic_norm = self.accelerator.clip_grad_norm_(self.critic.parameters(), self.args.max_grad_norm)
        if hasattr(critic_norm, "full_tensor"):  # a DTensor under FSDP2
            critic_norm = critic_norm.full_tensor()
        self._metrics["train"]["critic/grad_norm"].append(float(critic_norm))
        return norm

    # -- credit -------------------------------------------------------------------------------------------------------

    def _turn_rewards(self, batch: RolloutBatch) -> list[list[float]]:
        """Per episode of `batch` and turn: the environment's weighted reward under `reward_mode`, trajectory
        `reward_funcs` (weighted) added on the final turn."""
        return self._with_trajectory_rewards([list(r) for r in batch.turn_rewards], batch.local_scores(),
                                             batch.reward_weights)

    def _token_rewards(self, batch: RolloutBatch, length: int, device) -> torch.Tensor:
        """(B, length): each turn's reward on the last token the model sampled in that turn; 0 elsewhere and for
        failed episodes."""
        rewards = torch.zeros(len(batch), length, device=device)
        for i, (ep, turn_rewards) in enumerate(zip(batch.episodes, self._turn_rewards(batch))):
            if ep.failed:
                continue
            for (start, end), reward in zip(ep.turn_spans, turn_rewards):
                if end > start:
                    rewards[i, end - 1] += reward
        return rewards

    def _loss_advantages(self, output: dict, batch: RolloutBatch) -> torch.Tensor:
        """(B, T) advantages from the value estimator on the critic's values (whitened if configured); also puts
        the value targets (`returns`, `old_values`, `value_mask`) in `output`, the inputs of the value loss
        (`_compute_loss` reads them from its inputs dict)."""
        mode = batch.mode
        completion_ids = output["completion_ids"]
        mask = (output["completion_mask"] * output["tool_mask"]).bool()
        input_ids = torch.cat([output["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        length = completion_ids.size(1)
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        rewards = self._token_rewards(batch, length, completion_ids.device)
        with torch.no_grad(), self.accelerator.autocast():
            values = torch.cat([
                token_values(self.critic, input_ids[i: i + batch_size], attention_mask[i: i + batch_size], length)
                for i in range(0, input_ids.size(0), batch_size)
            ]) * mask
            if self.args.kl_coef != 0.0:
                kl = self._sampled_token_kl(output, input_ids, attention_mask, length, batch_size)
                rewards = rewards - self.args.kl_coef * kl * mask
                self._log_masked_mean(mode, "kl_in_reward", kl, mask)
        estimator = get_value_estimator(self.args.advantage_estimator)
        targets = estimator(ValueBatch(rewards, values, mask), gamma=self.args.gamma, lam=self.args.lam)
        advantages = targets.advantages
        moments = self._global_moments(advantages, mask)
        if self.args.whiten_advantages:
            advantages = masked_whiten(advantages, mask, moments)
        value_mask = targets.value_mask & mask
        output.update(returns=targets.returns, old_values=values, value_mask=value_mask)
        self._log_critic_metrics(mode, moments, values, targets.returns, value_mask)
        return advantages

    def _log_critic_metrics(self, mode: str, advantage_moments, values, returns, value_mask) -> None:
        """The advantages' mean and std over the sampled tokens before whitening, the critic's mean value and target,
        and its explained variance over the positions it is trained on: 1 - Var(R - V) / Var(R) (1: the critic
        predicts every return; 0: no better than the mean return; below 0: worse)."""
        metrics = self._metrics[mode]
        total, total_sq, count = advantage_moments.tolist()
        mean = total / max(count, 1.0)
        metrics["credit/advantage_mean"].append(mean)
        metrics["credit/advantage_std"].append(math.sqrt(max(total_sq - count * mean ** 2, 0.0) / max(count - 1, 1.0)))
        value_moments = self._global_moments(values, value_mask)
        return_moments = self._global_moments(returns, value_mask)
        error_moments = self._global_moments(returns - values, value_mask)
        count = value_moments[2].clamp(min=1.0)
        metrics["critic/value_mean"].append((value_moments[0] / count).item())
        metrics["critic/return_mean"].append((return_moments[0] / count).item())

        def variance(moments):
            return moments[1] / count - (moments[0] / count) ** 2

        return_var = variance(return_moments)
        explained = 1 - variance(error_moments) / return_var if return_var > 1e-12 else torch.tensor(math.nan)
        metrics["critic/explained_variance"].append(explained.item())

    def _sampled_token_kl(self, output, input_ids, attention_mask, length: int, batch_size: int) -> torch.Tensor:
        """(B, T) log pi_old - log pi_ref per token: the policy's log-probs TRL kept (or a fresh no-grad forward)
        against the reference's."""
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            old = output.get("old_per_token_logps")
            if old is None:
                old = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, length, batch_size)[0]
            ref = output.get("ref_per_token_logps")
            if ref is None:
                ref = self._reference_logps(input_ids, attention_mask, length, batch_size)
        return old - ref

    def _global_moments(self, values, mask):
        """(sum, sum of squares, count) of `values` over `mask`, summed over all processes (for whitening)."""
        return self.accelerator.reduce(masked_moments(values, mask), reduction="sum")

    # -- loss ---------------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        policy_loss = super()._compute_loss(model, inputs)
        mode = "train" if self.model.training else "eval"
        self.critic.train(self.model.training)
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with self.accelerator.autocast():
            values = token_values(self.critic, input_ids, attention_mask, inputs["completion_ids"].size(1))
        value_loss, clip_fraction = clipped_value_loss(values, inputs["old_values"], inputs["returns"],
                                                       inputs["value_mask"], self.args.cliprange_value)
        reported = self.accelerator.reduce(torch.stack([value_loss, clip_fraction]).detach(), reduction="mean")
        self._metrics[mode]["critic/value_loss"].append(reported[0].item())
        self._metrics[mode]["critic/clip_fraction"].append(reported[1].item())
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        critic_loss = self.args.vf_coef * value_loss / normalizer
        if self.is_deepspeed_enabled and mode == "train" and critic_loss.requires_grad:
            self._critic_loss = critic_loss  # `training_step` takes its backward on the critic's engine
            critic_loss = critic_loss.detach()
        return policy_loss + critic_loss

    # -- checkpoints --------------------------------------------------------------------------------------------------

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """TRL's `save_model` (every checkpoint goes through it), then the critic in `critic/`. Under FSDP and
        DeepSpeed every process takes part in gathering the critic's full weights; the main process writes them."""
        super().save_model(output_dir, _internal_call)
        gather = self.is_fsdp_enabled or (self.is_deepspeed_enabled and critic_engine.is_engine(self.critic))
        state_dict = self.accelerator.get_state_dict(self.critic) if gather else None
        if self.args.should_save:
            save_value_model(self.unwrapped_critic, output_dir if output_dir is not None else self.args.output_dir,
                             state_dict=state_dict)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        with self._fsdp_optimizer_over_policy_and_critic():
            super()._save_optimizer_and_scheduler(output_dir)
        if self.is_deepspeed_enabled:
            critic_engine.save_engine_state(self.critic, output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        with self._fsdp_optimizer_over_policy_and_critic():
            super()._load_optimizer_and_scheduler(checkpoint)
        if self.is_deepspeed_enabled and checkpoint is not None:  # the critic's weights, optimizer and scheduler
            critic_engine.load_engine_state(self.critic, checkpoint)

    @contextmanager
    def _fsdp_optimizer_over_policy_and_critic(self):
        """Under FSDP, Trainer saves and loads the optimizer's state through torch's `get/set_optimizer_state_dict`
        on the policy, which names each parameter by its place in that model and cannot name the critic's. For the
        duration of the block, the model those helpers see is one container of both (`policy.*`, `critic.*`)."""
        import transformers.trainer as hf_trainer

        if not self.is_fsdp_enabled:
            yield
            return
        both = nn.ModuleDict({"policy": self.model, "critic": self.critic})
        saved = {name: getattr(hf_trainer, name) for name in ("save_fsdp_optimizer", "load_fsdp_optimizer")}

        def over_both(helper):
            def call(fsdp_plugin, accelerator, optimizer, model, *args, **kwargs):
                return helper(fsdp_plugin, accelerator, optimizer, both, *args, **kwargs)
            return call

        for name, helper in saved.items():
            setattr(hf_trainer, name, over_both(helper))
        try:
            yield
        finally:
            for name, helper in saved.items():
                setattr(hf_trainer, name, helper)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_value_model_weights(self.unwrapped_critic if not self.is_fsdp_enabled else self.critic,
                                 resume_from_checkpoint, sharded=self.is_fsdp_enabled)
