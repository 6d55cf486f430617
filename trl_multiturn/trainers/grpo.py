"""`MultiTurnGRPOTrainer`: TRL's `GRPOTrainer` playing whole episodes against an environment."""

from __future__ import annotations

from dataclasses import dataclass

import trl.trainer.grpo_trainer as trl_grpo
from trl import GRPOConfig, GRPOTrainer

from ..config_checks import check_fields, config_field
from .estimator_credit import EstimatorCredit
from .importance import DEFAULT_MODE, IMPORTANCE_SAMPLING_MODES, check_importance_sampling
from .multiturn import (
    MultiTurnArguments,
    MultiTurnMixin,
    bf16_only_where_supported,
    mask_truncated_field,
    trainer_prologue,
    trl_constructor,
)


@dataclass
class MultiTurnGRPOConfig(GRPOConfig, MultiTurnArguments):
    """`GRPOConfig` plus the multi-turn fields of `MultiTurnArguments` (max_turns, reward_mode, estimator, ...).

    `max_completion_length` caps one reply; `max_episode_tokens` caps the whole episode.

    Parameters:
        > Parameters that control the loss

        mask_truncated_completions (`bool`, defaults to `False`):
            Leave truncated episodes (cut by `max_turns` or `max_episode_tokens`) out of the loss (TRL's field, with
            its multi-turn meaning).
        vllm_importance_sampling_mode (`str`, defaults to `"token_truncate"`):
            How vLLM's sampling log-probs correct the loss: `<level>_<constraint>`, level 'token', 'turn',
            'geometric' (length-neutral) or TRL's 'sequence' (a product over the whole episode), constraint
            'truncate' or 'mask' (TRL's field, with a multi-turn default and two more levels).
    """

    # Parameters that control the loss
    mask_truncated_completions: bool = mask_truncated_field()
    vllm_importance_sampling_mode: str = config_field(
        DEFAULT_MODE,
        "With use_vllm and vllm_importance_sampling_correction: how each trained token's loss is weighted by "
        "rho = pi_old / pi_vllm, as '<level>_<constraint>'. Level: 'token' (each token its own ratio), 'turn' (the "
        "geometric mean of the ratios over the token's turn), 'geometric' (their geometric mean over the row: the "
        "episode, or a step-wise step), 'sequence' (TRL's: their product over the row, so a long episode's weight "
        "drifts with its length). Constraint: 'truncate' clamps rho to [vllm_importance_sampling_clip_min, "
        "vllm_importance_sampling_clip_max], 'mask' sets it to 0 outside. The default 'token_truncate' weighs an "
        "episode the same whatever its length when its per-token ratios are the same (TRL's default is "
        "'sequence_mask'); see docs/vllm.md.",
        choices=IMPORTANCE_SAMPLING_MODES)

    def __post_init__(self):
        check_fields(self)  # before TRL's own checks
        bf16_only_where_supported(self)
        super().__post_init__()
        self.check_multiturn_args()
        if self.vllm_importance_sampling_correction:
            check_importance_sampling(self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min,
                                      self.vllm_importance_sampling_clip_max)

    def unused_fields(self) -> dict[str, str]:
        return {**super().unused_fields(), "multi_objective_aggregation": (
            "multi-turn credit adds each reward function's weighted score to the final turn's reward and then "
            "applies advantage_estimator; weight the functions with reward_weights")}


class MultiTurnGRPOTrainer(MultiTurnMixin, GRPOTrainer):
    """GRPO over multi-turn episodes.

    Same arguments as `trl.GRPOTrainer`; `environment_factory` here is a callable returning a fresh
    `trl_multiturn.Environment` (not TRL's tool-calling environment), and each `train_dataset` row is one task that
    the environment's `reset` understands. `reward_funcs` are optional extra trajectory-level rewards with TRL's
    signature; the environment's return under `reward_mode` is always the first reward source. With a model object
    and `beta > 0`, the reference model is a frozen copy of that object (not reloaded from `config._name_or_path`).
    `teacher_model` (a path, a name or a model object sharing the student's tokenizer; or the config's
    `teacher_model_name_or_path`) scores every sampled token for on-policy distillation (`distillation.py`).

    With `episode_format="stepwise"` TRL's rows are the step samples (`RolloutBatch.steps`; their number per process
    is `steps_per_batch`), each with its turn's advantage A[i, k]. The loss normalisation is TRL's `loss_type`: with
    its default "dapo", per token over the generation batch, L = -sum_{s,t} m[s,t] surrogate[s,t] / sum_{s,t} m[s,t]
    (a step weighs in proportion to its reply's length); "grpo" averages each step first, and with
    `count_episodes_once` (default) each step's advantages are scaled so that its episode counts once
    (docs/stepwise.md, "One episode, one weight").
    """

    _tag_names = ["trl", "grpo", "trl-multiturn"]

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: MultiTurnGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
        teacher_model=None,
    ):
        model, args = trainer_prologue(type(self), MultiTurnGRPOConfig, model, args)
        if tools or rollout_func is not None:
            raise ValueError("MultiTurnGRPOTrainer plays episodes through `environment_factory`; `tools` and "
                             "`rollout_func` belong to TRL's single-call GRPOTrainer and cannot be combined with it.")
        if args.scale_rewards == "batch":
            raise ValueError("scale_rewards='batch' is not supported for multi-turn credit; use 'group' or 'none'.")
        reward_funcs, reward_processing_classes = self._with_environment_reward(
            reward_funcs, args, reward_processing_classes
        )
        with trl_constructor(trl_grpo, model, args, peft_config):
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
            )
        self._init_multiturn(environment_factory, teacher_model)

    def _credit(self) -> EstimatorCredit:
        """The configured estimator, with GRPO's per-group std scaling (`scale_rewards`)."""
        return EstimatorCredit(self.args.advantage_estimator, self.args.estimator_kwargs,
                               {"gamma": self.args.turn_gamma, "scale": self.args.scale_rewards != "none"},
                               reference=self.beta != 0.0, log=self.step_log)
