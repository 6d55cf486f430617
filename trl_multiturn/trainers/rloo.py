"""`MultiTurnRLOOTrainer`: TRL's `RLOOTrainer` playing whole episodes against an environment.

TRL's RLOO is a sequence-level method: one importance ratio per completion, exp(sum of its token log-probs minus
the old ones), clipped like PPO, times one advantage; the KL penalty is folded into the reward. Its scoring and
loss use `completion_mask` both as the attention mask and to sum the sequence log-probability. An episode's
completion interleaves the model's replies with observation tokens, which must be attended to but never counted,
so this trainer keeps `env_mask` separate: the attention mask covers every real token, and every sum that defines
the objective (the sequence log-probability, the old one, the KL penalty, the entropy metric) runs over `env_mask`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import trl.trainer.rloo_trainer as trl_rloo
from trl import RLOOConfig, RLOOTrainer

from ..config_checks import check_fields, config_field
from ..credit.tokens import turn_index
from .estimator_credit import EstimatorCredit
from .multiturn import (
    MultiTurnArguments,
    MultiTurnMixin,
    bf16_only_where_supported,
    mask_truncated_field,
    trainer_prologue,
    trl_constructor,
)

LOSS_GRANULARITIES = ("episode", "turn")


@dataclass
class MultiTurnRLOOConfig(RLOOConfig, MultiTurnArguments):
    """`RLOOConfig` plus the multi-turn fields of `MultiTurnArguments` (max_turns, reward_mode, estimator, ...).

    `max_completion_length` caps one reply; `max_episode_tokens` caps the whole episode. `beta` (TRL's default
    0.05) is the coefficient of the KL penalty folded into each turn's reward: beta * sum over the turn's sampled
    tokens of (log pi_old - log pi_ref).

    Parameters:
        > Parameters that control the credit

        advantage_estimator (`str`, defaults to `"rloo"`):
            Name of the advantage estimator in `trl_multiturn.credit.ESTIMATORS` ('rloo': the episode's return
            minus the mean return of the other episodes of its task).

        > Parameters that control the loss

        loss_granularity (`str`, defaults to `"episode"`):
            What one importance ratio covers: 'episode' (TRL's RLOO) or 'turn' (needed by turn-level estimators).
        mask_truncated_completions (`bool`, defaults to `False`):
            Leave truncated episodes (cut by `max_turns` or `max_episode_tokens`) out of the loss (TRL's field, with
            its multi-turn meaning).
    """

    # Parameters that control the credit
    advantage_estimator: str = field(
        default="rloo",
        metadata={"help": "Name of the advantage estimator in `trl_multiturn.credit.ESTIMATORS`. 'rloo' (default): "
                          "the episode's return minus the mean return of the other episodes of its task."},
    )

    # Parameters that control the loss
    loss_granularity: str = config_field(
        "episode", "What one importance ratio covers. 'episode' (TRL's RLOO): the whole episode's sampled tokens, "
                   "with one advantage per episode. 'turn': each turn's reply, with that turn's advantage; needed by "
                   "turn-level estimators (e.g. 'turn_rloo', 'gigpo').",
        choices=LOSS_GRANULARITIES)
    mask_truncated_completions: bool = mask_truncated_field()

    def __post_init__(self):
        check_fields(self)  # before TRL's own checks
        bf16_only_where_supported(self)
        super().__post_init__()
        self.check_multiturn_args()

    def policy_lag_refusal(self) -> str | None:
        return ("its one importance ratio per episode or turn has no per-token behaviour correction yet; use "
                "MultiTurnGRPOConfig for off-policy training, or max_policy_lag=0")

    def teacher_loss_refusal(self) -> str | None:
        if self.loss_granularity == "episode":
            return ("the teacher gives each token its own advantage, and loss_granularity='episode' takes one per "
                    "episode: set loss_granularity='turn' (each turn's advantage the mean of its tokens'), or "
                    "teacher_signal='reward'")
        return None

    def unused_fields(self) -> dict[str, str]:
        return {**super().unused_fields(), "reward_clip_range": (
            "it clips one reward per completion, which multi-turn credit does not have; shape per-turn rewards with "
            "reward_mode / format_penalty instead")}


def segment_sums(values: torch.Tensor, index: torch.Tensor, num_segments: int) -> torch.Tensor:
    """(B, num_segments): S[i, k] = sum of values[i, t] over the t with index[i, t] == k (index -1: no segment)."""
    out = torch.zeros(values.shape[0], num_segments + 1, dtype=values.dtype, device=values.device)
    out.scatter_add_(1, (index + 1).clamp(min=0), torch.where(index >= 0, values, 0.0))
    return out[:, 1:]


def segment_surrogate(per_token_logps, old_per_token_logps, advantages, index, epsilon_low: float,
                      epsilon_high: float):
    """RLOO's clipped surrogate with one importance ratio per segment (an episode, or a turn).

        log rho_s = sum_{t in s} (log pi(y_t) - log pi_old(y_t)),     A_s = mean_{t in s} A_t
        L = -1/|S| sum_s min(rho_s A_s, clip(rho_s, 1 - epsilon_low, 1 + epsilon_high) A_s)

    over the segments S that hold at least one token. Positions with index -1 (observations, template tokens,
    padding) take part in nothing. Returns (loss, per-segment ratio, per-segment advantage, segment mask).
    """
    num_segments = int(index.max().item()) + 1 if (index >= 0).any() else 1
    counts = segment_sums(torch.ones_like(per_token_logps), index, num_segments)
    present = counts > 0
    log_ratio = segment_sums(per_token_logps - old_per_token_logps, index, num_segments)
    seg_adv = segment_sums(advantages, index, num_segments) / counts.clamp(min=1)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_segment = -torch.min(ratio * seg_adv, clipped * seg_adv)
    loss = (per_segment * present).sum() / present.sum().clamp(min=1)
    return loss, ratio, seg_adv, present


class RLOOCredit(EstimatorCredit):
    """`EstimatorCredit` that, with `loss_granularity='episode'` (`one_per_episode`), refuses an estimator giving the
    turns of one episode different advantages: one importance ratio covers the whole episode there."""

    def __init__(self, *args, one_per_episode: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.one_per_episode = one_per_episode

    def needs_old_logps(self) -> bool:
        return True  # RLOO's loss takes the ratio to pi_old per segment

    def __call__(self, batch, x, old, ref, token_rewards=None):
        advantages, extra = super().__call__(batch, x, old, ref, token_rewards)
        if self.one_per_episode:
            check_one_advantage_per_episode(advantages, x.trained, self.name)
        return advantages, extra


def check_one_advantage_per_episode(advantages, trained, estimator: str) -> None:
    """Refuse (B, T) advantages that differ between the trained tokens of one row."""
    sampled = trained.bool()
    high = torch.where(sampled, advantages, -torch.inf).amax(dim=1)
    low = torch.where(sampled, advantages, torch.inf).amin(dim=1)
    if (sampled.any(dim=1) & ~torch.isclose(high, low, atol=1e-6)).any():
        raise ValueError(f"advantage_estimator={estimator!r} gives the turns of one episode different advantages, "
                         "but loss_granularity='episode' takes one advantage per episode. Set "
                         "loss_granularity='turn'.")


class MultiTurnRLOOTrainer(MultiTurnMixin, RLOOTrainer):
    """RLOO over multi-turn episodes.

    With `episode_format="stepwise"` each row is one step sample, so one importance ratio covers one step's reply
    (either `loss_granularity`), with its turn's advantage; the loss is the mean over the rows' segments (per step).

    Same arguments as `trl.RLOOTrainer`, with `reward_funcs` optional: the environment's return under `reward_mode`
    is always the first reward source, and `reward_funcs` add trajectory-level rewards with TRL's signature.
    `environment_factory` is a callable returning a fresh `trl_multiturn.Environment`; each `train_dataset` row is
    one task that its `reset` understands. With a model object and `beta > 0`, the reference model is a frozen copy
    of that object (not reloaded from `config._name_or_path`). `teacher_model`: as `MultiTurnGRPOTrainer`'s (on-policy
    distillation).
    """

    _tag_names = ["trl", "rloo", "trl-multiturn"]

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: MultiTurnRLOOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        environment_factory=None,
        teacher_model=None,
    ):
        model, args = trainer_prologue(type(self), MultiTurnRLOOConfig, model, args)
        reward_funcs, reward_processing_classes = self._with_environment_reward(
            reward_funcs, args, reward_processing_classes
        )
        with trl_constructor(trl_rloo, model, args, peft_config):
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

    def _credit(self) -> RLOOCredit:
        """The configured estimator without per-group std scaling (RLOOConfig has none), the KL penalty folded into
        each turn's reward (beta), and `normalize_advantages`."""
        return RLOOCredit(self.args.advantage_estimator, self.args.estimator_kwargs,
                          {"gamma": self.args.turn_gamma, "scale": False}, kl_in_reward=self.beta,
                          normalize=self.normalize_advantages, one_per_episode=self.args.loss_granularity == "episode",
                          reference=self.beta != 0.0, log=self.step_log)

    # -- loss ---------------------------------------------------------------------------------------------------------

    def _loss_segments(self, env_mask) -> torch.Tensor:
        """(B, T) segment index of each sampled token (-1 elsewhere): 0 for the whole episode, or the turn index."""
        if self.args.loss_granularity == "turn":
            return turn_index(env_mask)
        return torch.where(env_mask.bool(), 0, -1)

    def _compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        env_mask = inputs["tool_mask"]  # TRL's name of the trained mask (`StepTensors.trained`)
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
        )
        segments = self._loss_segments(env_mask)
        loss, ratio, seg_adv, present = segment_surrogate(
            per_token_logps, inputs["old_per_token_logps"], inputs["advantages"], segments, self.epsilon_low,
            self.epsilon_high,
        )
        mode = "train" if self.model.training else "eval"
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self.step_log.masked_mean(mode, "entropy", entropies, env_mask)
        clipped = ((ratio < 1 - self.epsilon_low) & (seg_adv < 0)) | ((ratio > 1 + self.epsilon_high) & (seg_adv > 0))
        self.step_log.masked_mean(mode, "clip_ratio/region_mean", clipped.float(), present)
        return loss
