"""`MultiTurnPPOTrainer`: PPO with a critic over multi-turn episodes, built on TRL's GRPO machinery.

TRL (1.14-1.16) has no PPO trainer. This one takes `MultiTurnGRPOTrainer`'s generation backends (vLLM included),
TRL's batching (multiple PPO epochs through `num_iterations`, mini-batches through `steps_per_generation`) and the
multi-turn step (`step.MultiTurnStep`: rollout, old and reference log-probs, scores), with its own credit
(`ppo_credit.CriticCredit`) and loss:

- a critic (`value_model.py`): its own backbone with a scalar head (a new head starts at zero), initialised from
  the policy or a given path, optionally with a PEFT adapter;
- per-token rewards: each turn's reward on its last sampled token, minus `kl_coef` * (log pi_old - log pi_ref) on
  every sampled token (the KL penalty folded into the reward, the paper's setting); GRPO's `beta` still adds the
  KL as a loss term if set;
- advantages and value targets from a value estimator of `credit.gae` (GAE over the sampled tokens by default,
  observation tokens skipped), whitened over the batch's sampled tokens;
- its own loss: the clipped surrogate on those (B, T) advantages plus `vf_coef` times the clipped value loss, each a
  mean over a mini-batch's sampled tokens (TRL's GRPO loss variants are refused: `PPO_LOSS_UNUSED`);
- `episode_format="stepwise"`: each row is one step sample (its context as the model saw it, its reply), valued by
  the critic on that context; the estimator runs across the steps of each episode
  (`credit.gae.stepwise_value_targets`), with a critic pass over the steps `steps_per_batch` leaves out of the rows.

Design choices:

- One model. The policy and the critic are one module (`value_model.PolicyAndValueModel`, as TRL's former
  `PolicyAndValueWrapper`): the trainer's `model`, so transformers' one optimizer (the critic's groups at
  `critic_learning_rate`), gradient accumulation, clipping (one norm over both), scheduler, DDP / FSDP2 / DeepSpeed
  preparation and checkpoints of optimizer state cover the critic with no second loop or engine.
- The algorithm is in two files: its credit (`ppo_credit.CriticCredit`: per-token rewards, the critic's values,
  `credit.gae`'s estimator, whitening) and its loss (`_compute_loss` here: one forward of policy and critic; the
  clipped surrogate plus `vf_coef` times the clipped value loss); the step (`step.MultiTurnStep`) runs the credit.
- Checkpoints: every checkpoint (and the final `save_model`) holds the policy as TRL writes it plus the critic in a
  `critic/` sub-folder (`save_pretrained` layout); the optimizer's and DeepSpeed's / FSDP's resume state are
  transformers' own, over both models.
- The critic's dropout is always off: value targets and value clipping assume the critic is deterministic.
- Scaling out: DDP, FSDP2 and DeepSpeed ZeRO-2/3 prepare the one module (tests/distributed/ppo_sharded.py, 2 CPU
  processes). FSDP2 takes as its root the first sharded module to run a forward, so every forward goes through
  the one module: the loss, the values and the episode-history cache's generation do; TRL's own `generate` path
  (`cache_episode_history=False`, or min_p, ...) calls the policy directly and is refused under FSDP2. FSDP1 is
  untested (accelerate's FSDP1 plugin refuses CPU).
- The reference model of the KL in the reward is PPO's own where TRL builds none (TRL builds one only for its
  loss's `beta != 0`): the policy as given, prepared for the backend as TRL prepares its own (`_reward_reference`).
- PPO keeps subclassing the GRPO trainer and its config (decided for issue 62): what it takes from them is TRL's
  generation-batch machinery (`_prepare_inputs`' buffering of one generation batch over `steps_per_generation` *
  `num_iterations` micro-batches, TRL's shuffling and splitting, the vLLM colocate and server backends and their
  weight sync, `epsilon`/`num_iterations`/`steps_per_generation` and the generation fields), none of which is
  public TRL API to build on otherwise: a standalone trainer over transformers' `Trainer` would re-implement it or
  reach into more private TRL names than the one boundary table allows. The price is in the config only:
  `_GroupOfOne` lets `num_generations=1` through `GRPOConfig.__post_init__`, which refuses groups of one (GRPO's
  baseline needs two; PPO's is the critic), and `unused_fields` refuses the GRPO loss fields PPO's loss has not.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

import torch
from accelerate.utils import is_peft_model
from torch import nn
from transformers import set_seed
from transformers.trainer import TRAINING_ARGS_NAME
from trl.trainer.utils import create_model_from_path, disable_dropout_in_model

from ..config_checks import Range, check_fields, config_field
from ..credit.gae import get_value_estimator
from .grpo import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from .logprobs import token_logps_and_entropies
from .multiturn import trainer_prologue
from .packing import PackPlan, check_model_packing, packed_policy_and_values
from .packing_states import ForkPlan
from .ppo_credit import CriticCredit
from .value_model import PolicyAndValueModel, create_value_model, load_value_model_weights, save_value_model


class _GroupOfOne(int):
    """`num_generations=1` while `GRPOConfig.__post_init__` runs: it refuses groups of one, which GRPO's baseline
    needs and PPO (whose baseline is the critic) does not. Every other check sees the plain value 1."""

    def __lt__(self, other):
        return False


PPO_LOSS_UNUSED = ("loss_type", "importance_sampling_level", "top_entropy_quantile", "entropy_coef",
                   "use_adaptive_entropy", "off_policy_mask_threshold", "delta")
"""GRPOConfig fields of TRL's GRPO loss that PPO's loss (`MultiTurnPPOTrainer._compute_loss`) does not have."""


@dataclass
class MultiTurnPPOConfig(MultiTurnGRPOConfig):
    """`GRPOConfig` + the multi-turn fields + PPO's critic, GAE and KL-in-reward fields.

    GRPO fields keep their meaning: `epsilon` clips the policy ratio, `num_iterations` is the number of PPO epochs
    over one batch of episodes, `steps_per_generation` the number of mini-batches, `beta` an optional KL *loss*
    term. Each field's help says more (`trl-multiturn train ppo --help`).

    Parameters:
        > Parameters that control the episodes per task

        num_generations (`int`, defaults to `1`):
            Episodes played per task in a batch (TRL's field; PPO's baseline is the critic, so 1 is allowed).

        > Parameters that control the credit

        advantage_estimator (`str`, defaults to `"gae"`):
            Value-based estimator in `trl_multiturn.credit.gae.VALUE_ESTIMATORS`: 'gae' or 'turn_gae'.
        gamma (`float`, defaults to `1.0`):
            GAE discount per step.
        lam (`float`, defaults to `1.0`):
            GAE lambda.
        kl_coef (`float`, defaults to `0.05`):
            Coefficient of the KL penalty folded into the per-token reward (0: none).
        whiten_advantages (`bool`, defaults to `True`):
            Normalise advantages to mean 0 and std 1 over the batch's sampled tokens.

        > Parameters that control the critic

        value_model (`str`, *optional*):
            Path or Hub id of the critic's initial weights (None: a copy of the policy's backbone).
        critic_learning_rate (`float`, *optional*):
            Learning rate of the critic's parameters (None: `learning_rate`).
        vf_coef (`float`, defaults to `0.1`):
            Weight of the value loss in the total loss.
        cliprange_value (`float`, defaults to `0.2`):
            The critic's new values are clipped to old value +- cliprange_value in the value loss.
    """

    # Parameters that control the episodes per task
    num_generations: int | None = config_field(
        1, "Episodes played per task in a batch. PPO's baseline is the critic, so 1 is allowed.",
        range=Range(ge=1, text="an integer >= 1 (episodes per task; PPO allows 1), or None"))

    # Parameters that control the credit
    advantage_estimator: str = field(
        default="gae",
        metadata={"help": "Value-based estimator in `trl_multiturn.credit.gae.VALUE_ESTIMATORS`: 'gae' (token "
                          "level: every sampled token is a step, observation tokens are skipped) or 'turn_gae' "
                          "(each turn is a step, valued at its first token). episode_format='stepwise': the same, "
                          "run across the steps of each episode, each reply valued on its own step's context."},
    )
    gamma: float = config_field(1.0, "GAE discount per step (the paper: 1.0).", range=Range(ge=0, le=1))
    lam: float = config_field(1.0, "GAE lambda (the paper: 1.0).", range=Range(ge=0, le=1))
    kl_coef: float = config_field(
        0.05, "Coefficient of the KL penalty folded into the per-token reward: r_t -= kl_coef * (log pi_old - log "
              "pi_ref) on every sampled token. 0 disables it (and, with beta=0, the reference model).",
        range=Range(ge=0))
    whiten_advantages: bool = field(
        default=True,
        metadata={"help": "Normalise advantages to mean 0 and std 1 over the sampled tokens of the batch (all "
                          "processes)."},
    )

    # Parameters that control the critic
    value_model: str | None = field(
        default=None,
        metadata={"help": "Path or Hub id of the critic's initial weights (a saved critic or any backbone). None: "
                          "the critic's backbone starts as a copy of the policy's. A new scalar head starts at zero "
                          "(every value 0 until the critic has seen returns)."},
    )
    critic_learning_rate: float | None = config_field(
        None, "Learning rate of the critic's parameters. None: `learning_rate`.",
        range=Range(gt=0, text="a number > 0, or None for `learning_rate`"))
    vf_coef: float = config_field(0.1, "Weight of the value loss in the total loss.", range=Range(ge=0))
    cliprange_value: float = config_field(
        0.2, "The critic's new values are clipped to old value +- cliprange_value in the clipped value loss.",
        range=Range(gt=0))

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

    def policy_lag_refusal(self) -> str | None:
        return ("its critic's values and GAE are computed for the live policy's samples; use MultiTurnGRPOConfig for "
                "off-policy training, or max_policy_lag=0")

    def teacher_loss_refusal(self) -> str | None:
        return ("its critic learns the environment's returns, which would then train nothing: use "
                "teacher_signal='reward' (the teacher's per-token rewards join PPO's token rewards before GAE), or "
                "MultiTurnGRPOConfig / MultiTurnRLOOConfig")

    def check_advantage_estimator(self) -> None:
        get_value_estimator(self.advantage_estimator)

    def unused_fields(self) -> dict[str, str]:
        return {
            **super().unused_fields(),
            "turn_gamma": "PPO discounts with its value estimator's gamma and lam: set gamma",
            "estimator_kwargs": "PPO's value estimators take gamma and lam: set those fields",
            "scale_rewards": "PPO normalises its advantages with whiten_advantages",
            "load_best_model_at_end": "transformers would load the best checkpoint's policy into the "
                                      "policy-and-critic module; resume from that checkpoint instead",
            **{name: "PPO's loss is its own: the clipped surrogate (epsilon, epsilon_high) and the clipped value "
                     "loss, each a mean over a mini-batch's sampled tokens" for name in PPO_LOSS_UNUSED},
            **{name: "PPO's critic learns from every episode, tied groups included: dynamic sampling is GRPO's and "
                     "RLOO's" for name in ("dynamic_sampling", "dynamic_sampling_max_draws",
                                           "dynamic_sampling_set_aside_steps", "dynamic_sampling_set_aside_ties")},
        }


def clipped_surrogate(ratio, advantages, epsilon_low: float, epsilon_high: float):
    """PPO's clipped surrogate per token, to minimise, with rho_t = pi(a_t | s_t) / pi_old(a_t | s_t):

        L_t = -min(rho_t A_t, clamp(rho_t, 1 - eps_low, 1 + eps_high) A_t)

    Returns (L_t, where the clip is active: the ratio is outside the range on the side the advantage pushes)."""
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    active = ((ratio < 1 - epsilon_low) & (advantages < 0)) | ((ratio > 1 + epsilon_high) & (advantages > 0))
    return loss, active


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


def masked_mean(values, mask):
    """mean of `values` over the positions where `mask` is True (0 where there are none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def policy_and_values(model, input_ids, attention_mask, logits_to_keep: int, *, temperature: float,
                      plan: PackPlan | ForkPlan | None = None):
    """(logps, entropies, values), each (B, K = logits_to_keep): PPO's loss forward of a `PolicyAndValueModel`, one
    forward of the policy and one of the critic, by `plan` (`packing.packed_policy_and_values`: tree-mask packs, or
    both models continued from their forked layer states) or over the padded rows: the policy's logits at the last
    K + 1 positions, the critic's head at the K positions before each kept token (V(s_t) never sees token t)."""
    if plan is not None:
        return packed_policy_and_values(model, plan, temperature=temperature)
    policy_out, values = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1,
                               use_cache=False, output="both")
    logps, entropies = token_logps_and_entropies(policy_out.logits[:, :-1], input_ids[:, -logits_to_keep:],
                                                 temperature, compute_entropy=True)
    return logps, entropies, values[:, -logits_to_keep - 1:-1]


def active_peft_config(model):
    """The active adapter's `PeftConfig` of a `PeftModel` policy (a LoRA policy gets a LoRA critic); else None."""
    from accelerate.utils import is_peft_model

    return model.peft_config[model.active_adapter] if isinstance(model, nn.Module) and is_peft_model(model) else None


class MultiTurnPPOTrainer(MultiTurnGRPOTrainer):
    """PPO with a critic over multi-turn episodes.

    Same arguments as `MultiTurnGRPOTrainer`, plus:
        value_model: the critic as a ready module (forward returning `.logits` of shape (B, L, 1)) or a path;
            overrides `args.value_model`. None: a critic initialised from the policy.
        value_peft_config: a `peft.PeftConfig` for the critic; defaults to `peft_config`, or to the adapter's config
            of a `PeftModel` policy (a LoRA policy gets a LoRA critic). A `PeftModel` policy's critic starts from
            its base model's weights.

    After construction `self.model` is the `PolicyAndValueModel` of the policy and the critic.

    With `episode_format="stepwise"` TRL's rows are step samples; V(s_t) is the critic's value before each reply token
    in the step's own sample (at its first reply token: the head at the last token of the step's context), GAE runs
    across an episode's steps (`credit.gae.stepwise_value_targets`: 'gae' over their reply tokens, 'turn_gae' one
    step per turn). The loss normalisation is per token: the surrogate is the mean over a mini-batch's trained reply
    tokens of all its step rows, L = sum_{s,t} m[s,t] L_clip[s,t] / sum_{s,t} m[s,t] (a step weighs in proportion to
    its reply's length); the value loss is the mean over its `value_mask` positions (every reply token with 'gae',
    one per step with 'turn_gae'); whitening is over the trained tokens of the generation batch's rows.
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
        teacher_model=None,
    ):
        model, args = trainer_prologue(type(self), MultiTurnPPOConfig, model, args)
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
        # TRL builds a reference model for its loss's KL term (beta != 0); PPO's KL penalty in the reward needs one
        # too, built here when TRL builds none (a PEFT policy's reference is the policy with its adapter disabled).
        own_reference = (args.kl_coef != 0.0 and args.beta == 0.0 and peft_config is None
                         and not (isinstance(model, nn.Module) and is_peft_model(model)))
        reference = copy.deepcopy(model) if own_reference and isinstance(model, nn.Module) else model
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
            teacher_model=teacher_model,
        )
        if own_reference:
            self.ref_model = self._reward_reference(reference)
        fsdp2 = self.is_fsdp_enabled and getattr(self.accelerator.state.fsdp_plugin, "fsdp_version", 1) == 2
        if fsdp2 and self.generation.history_cache is None and not self.use_vllm:
            raise ValueError("MultiTurnPPOTrainer under FSDP2 generates through the policy-and-critic module (its "
                             "root), which TRL's own generate path bypasses: keep cache_episode_history=True with "
                             "plain sampling, or use vLLM")
        disable_dropout_in_model(critic)  # value targets and value clipping assume deterministic values
        if self.place_model_on_device:
            critic.to(self.args.device)
        # From here on the trainer's model is policy and critic; transformers prepares, optimizes and saves it.
        self.model = self.model_wrapped = PolicyAndValueModel(self.model, critic)
        # policy and critic take one plan: tree-mask packs, or forked layer states where both fork (packing_states)
        check_model_packing(self.model, self.args.packing)

    def _reward_reference(self, model: str | nn.Module) -> nn.Module:
        """The reference model of PPO's KL penalty where TRL built none: the policy as given (loaded from its path as
        TRL loads a reference, or a copy of the policy object taken before training), frozen and prepared for the
        backend as TRL prepares its own."""
        if isinstance(model, str):
            model = create_model_from_path(model, **(self.args.model_init_kwargs or {}))
        return self._frozen_model(model)

    @property
    def unwrapped_critic(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model).critic

    # -- optimisation -------------------------------------------------------------------------------------------------

    def create_optimizer(self, model=None):
        """Trainer's optimizer over policy and critic, the critic's parameters in groups of their own at
        `critic_learning_rate` (Trainer has no per-module learning rate). Runs before any step, under DeepSpeed
        too (transformers passes it to the engine)."""
        optimizer = super().create_optimizer(model)
        if self.args.critic_learning_rate is None or any(group.get("critic") for group in optimizer.param_groups):
            return optimizer
        critic = {id(p) for p in self.unwrapped_critic.parameters()}
        for group in list(optimizer.param_groups):
            params = [p for p in group["params"] if id(p) in critic]
            group["params"] = [p for p in group["params"] if id(p) not in critic]
            if params:
                optimizer.add_param_group({"params": params, "lr": self.args.critic_learning_rate,
                                           "weight_decay": group["weight_decay"], "critic": True})
        return optimizer

    # -- credit (ppo_credit.py) ----------------------------------------------------------------------------------

    def _credit(self) -> CriticCredit:
        return CriticCredit(self.args, self.forwards, self.step_log, self.accelerator, beta=self.beta)

    # -- loss ---------------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        """PPO's loss on one mini-batch, from one forward of policy and critic:

            L = mean_t [ L_clip_t * w_t + beta * KL_t ] + vf_coef * L_V

        over the sampled tokens t (completion_mask * tool_mask): `clipped_surrogate` on the advantages,
        `clipped_value_loss` on the value targets, w_t vLLM's importance weights where TRL computed them, KL_t TRL's
        k3 estimate against the reference (only for beta > 0); divided by the gradient accumulation steps."""
        mode = "train" if self.model.training else "eval"
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        length = completion_ids.size(1)
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        plan = self.forwards.plan(input_ids, attention_mask, length, None)  # the micro-batch's rows, one budget
        with self.accelerator.autocast():
            logps, entropies, values = policy_and_values(model, input_ids, attention_mask, length,
                                                         temperature=self.temperature, plan=plan)
        old_logps = inputs.get("old_per_token_logps")  # None when the batch is trained on once: pi_old = pi
        old_logps = logps.detach() if old_logps is None else old_logps

        ratio = torch.exp(logps - old_logps)
        per_token, clipped = clipped_surrogate(ratio, inputs["advantages"], self.epsilon_low, self.epsilon_high)
        if "importance_sampling_ratio" in inputs:
            per_token = per_token * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            ref_logps = inputs["ref_per_token_logps"]
            kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
            if self.args.use_bias_correction_kl:
                kl = kl * ratio
            per_token = per_token + self.beta * kl
            self.step_log.masked_mean(mode, "kl", kl, mask)
        policy_loss = masked_mean(per_token, mask)
        value_loss, value_clipped = clipped_value_loss(values, inputs["old_values"], inputs["returns"],
                                                       inputs["value_mask"], self.args.cliprange_value)
        loss = policy_loss + self.args.vf_coef * value_loss

        self.step_log.masked_mean(mode, "entropy", entropies, mask)
        self.step_log.masked_mean(mode, "clip_ratio/region_mean", clipped.to(logps.dtype), mask)
        reported = self.accelerator.reduce(torch.stack([policy_loss, value_loss, value_clipped]).detach(),
                                           reduction="mean")
        for name, value in zip(("policy_loss", "critic/value_loss", "critic/clip_fraction"), reported.tolist()):
            self._metrics[mode][name].append(value)
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)

    # -- checkpoints --------------------------------------------------------------------------------------------------

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Where transformers writes its model (every backend's `save_model` ends here, with the whole weights
        gathered under FSDP and DeepSpeed): the policy as TRL writes it, the critic in `critic/`."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        model = self.accelerator.unwrap_model(self.model)
        policy_state, critic_state = model.split_state_dict(state_dict) if state_dict is not None else (None, None)
        model.policy.save_pretrained(output_dir, state_dict=policy_state)
        save_value_model(model.critic, output_dir, state_dict=critic_state)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """The weights `_save` wrote: the policy through transformers, the critic from `critic/`. Under FSDP
        transformers loads its own sharded checkpoint of the whole model instead (and DeepSpeed its engine's)."""
        if self.is_fsdp_enabled:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        both = self.accelerator.unwrap_model(self.model)
        super()._load_from_checkpoint(resume_from_checkpoint, both.policy)
        load_value_model_weights(both.critic, resume_from_checkpoint)
