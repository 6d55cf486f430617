"""The step's log: what a multi-turn step, its credit and the losses report, under TRL's and trl-multiturn's metric
names, into the trainer's metric and completion logs (TRL's `_metrics` and `_logs`, which TRL averages and prints
at each logging step)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch
from accelerate.utils import gather_object
from trl.trainer.utils import nanstd

if TYPE_CHECKING:
    from ..rollout import Episode
    from .batch import RolloutBatch
    from .step_tensors import StepTensors


class StepLog:
    """`metrics` and `logs` are the trainer's (TRL's `_metrics[mode][name]` lists and `_logs` columns), `state()` its
    current `TrainerState` (transformers makes a new one per `train()`), `reward_names` the reward sources' names,
    the environment's return first."""

    def __init__(self, metrics: dict, logs: dict, accelerator, state: Callable, reward_names: list[str]):
        self.metrics, self.logs, self.accelerator, self.state = metrics, logs, accelerator, state
        self.reward_names = reward_names

    def masked_mean(self, mode: str, name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
        """Log the mean of `values` over `mask`, over all processes (e.g. a per-token quantity over env_mask)."""
        mask = mask.to(values.dtype)
        totals = self.accelerator.reduce(torch.stack([(values * mask).sum(), mask.sum()]).detach(), reduction="sum")
        self.metrics[mode][name].append((totals[0] / totals[1].clamp(min=1.0)).item())

    # -- for reward functions -----------------------------------------------------------------------------------------

    def extra(self, mode: str):
        """`log_extra(column, values)` for reward functions: a column of the completion logs (one value per row)."""
        def log(column: str, values: list) -> None:
            self.logs["extra"][column].extend(gather_object(list(values)))
        return log

    def metric(self, mode: str):
        """`log_metric(name, value)` for reward functions: a scalar metric, averaged over processes."""
        def log(name: str, value: float) -> None:
            value = torch.tensor(float(value), device=self.accelerator.device)
            self.metrics[mode][name].append(self.accelerator.gather(value).mean().item())
        return log

    # -- the step -----------------------------------------------------------------------------------------------------

    def step(self, rows: list[dict], batch: RolloutBatch, x: StepTensors, advantages: torch.Tensor) -> None:
        """TRL's generation and reward metrics and completion logs (with the advantages the loss uses, per episode
        and per turn)."""
        accelerator, state = self.accelerator, self.state()
        mode, metrics = batch.mode, self.metrics[batch.mode]
        prompt_tokens = accelerator.gather(x.prompt_mask.sum(dim=1)).sum()
        sampled = accelerator.gather(x.trained.sum(dim=1))
        if mode == "train":
            state.num_input_tokens_seen += (prompt_tokens + sampled.sum()).item()
        metrics["num_tokens"] = [state.num_input_tokens_seen]
        # TRL's completion metrics, of the sampled tokens per row; an episode cut by the turn or token budget is
        # what TRL calls clipped
        lengths = sampled.float()
        ended = ~accelerator.gather(torch.tensor([ep.truncated for ep in batch.layout.row_episodes(batch)],
                                                 device=lengths.device))
        metrics["completions/mean_length"].append(lengths.mean().item())
        metrics["completions/min_length"].append(lengths.min().item())
        metrics["completions/max_length"].append(lengths.max().item())
        metrics["completions/clipped_ratio"].append(1.0 - ended.float().mean().item())
        terminated = lengths[ended] if ended.any() else torch.zeros(1, device=lengths.device)
        metrics["completions/mean_terminated_length"].append(terminated.mean().item())
        metrics["completions/min_terminated_length"].append(terminated.min().item())
        metrics["completions/max_terminated_length"].append(terminated.max().item())
        scores = batch.rewards_per_func
        for i, name in enumerate(self.reward_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(scores[:, i]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(scores[:, i]).item())
        total = (scores * batch.reward_weights.to(scores.device)).nansum(dim=1)
        total[torch.isnan(scores).all(dim=1)] = math.nan
        metrics["reward"].append(torch.nanmean(total).item())
        metrics["reward_std"].append(nanstd(total).item())
        batch.layout.log_reward_groups(metrics, total, batch.num_generations)
        self.logs["prompt"].extend(gather_object([row["prompt"] for row in rows]))
        self.logs["completion"].extend(gather_object(batch.completions()))
        for i, name in enumerate(self.reward_names):
            self.logs["rewards"][name].extend(scores[:, i].tolist())
        self.advantages(batch, advantages, x.trained)

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor, trained: torch.Tensor) -> None:
        """The advantages the loss uses in the completion logs: per row, `advantage` the mean of its (B, T)
        advantages over the tokens it trains on (NaN when none: a failed episode, one masked as truncated), and
        the extra column `turn_advantages` the same mean per turn, in turn order (one value repeated for
        trajectory-level estimators; PPO's token-level GAE averaged over each turn)."""
        mask = trained.bool()
        counts = mask.sum(dim=1)
        per_row = torch.where(counts > 0, (advantages * mask).sum(dim=1) / counts.clamp(min=1), torch.nan)
        per_turn = [[round((advantages[i, s:e] * mask[i, s:e]).sum().item() / mask[i, s:e].sum().item(), 4)
                     for s, e in spans if mask[i, s:e].any()] for i, spans in enumerate(batch.row_turn_spans())]
        self.logs["advantages"].extend(self.accelerator.gather(per_row).tolist())
        self.logs["extra"]["turn_advantages"].extend(gather_object(per_turn))

    def episodes(self, batch: RolloutBatch, episode_return: Callable[[Episode], float | None]) -> None:
        """The episodes' own metrics (`episodes/*`), `episode_return` their return under `reward_mode`."""
        stats = gather_object([
            (ep.won, ep.failed, ep.truncated, ep.num_turns, ep.num_tokens, sum(ep.env_mask), len(ep.completion_ids),
             episode_return(ep), float(sum(ep.turn_rewards)))
            for ep in batch.episodes
        ])
        valid = [s for s in stats if not s[1]]
        metrics = self.metrics[batch.mode]
        metrics["episodes/failed"].append(float(len(stats) - len(valid)))
        if not valid:
            return
        n = len(valid)
        metrics["episodes/success_rate"].append(sum(s[0] for s in valid) / n)
        metrics["episodes/truncated"].append(float(sum(s[2] for s in valid)))
        metrics["episodes/mean_turns"].append(sum(s[3] for s in valid) / n)
        metrics["episodes/mean_tokens"].append(sum(s[4] for s in valid) / n)
        metrics["episodes/mean_shaped_return"].append(sum(s[7] for s in valid) / n)  # under reward_mode
        metrics["episodes/mean_return"].append(sum(s[8] for s in valid) / n)  # the environment's, as evaluate's
        metrics["episodes/trained_token_fraction"].append(sum(s[5] for s in valid) / max(1, sum(s[6] for s in valid)))

    def policy_lag(self, batch: RolloutBatch, stale: list[bool]) -> None:
        """The lag of this step's samples (optimizer steps between the weights that sampled them and the weights
        they train), and how many were dropped for a lag above `max_policy_lag` (`stale`)."""
        lags = [self.state().global_step - v for v in batch.policy_versions]
        metrics = self.metrics[batch.mode]
        metrics["policy_lag/mean"].append(sum(lags) / len(lags))
        metrics["policy_lag/max"].append(float(max(lags)))
        metrics["policy_lag/dropped"].append(float(sum(stale)))

    def dynamic_sampling(self, mode: str, counts: dict[str, float]) -> None:
        """What dynamic sampling played this step (`dynamic_sampling.DynamicDraws.counts`, summed over processes):
        `dynamic_sampling/draws` (the rollouts played), `tied_fraction` (of the groups played, those whose returns
        all tied), `groups_kept` (groups with signal trained), `tied_groups_trained` (tied groups that filled the
        batch when `dynamic_sampling_max_draws` ran out), `dropped_groups` (played, not trained) and, with the
        curriculum, `set_aside_tasks` (set aside now), `newly_set_aside` and `replaced_tasks` (TRL's tasks replaced
        because they were set aside); `played_success_rate`: the success rate over every episode played (`played_won`
        of `played_valid`), where `episodes/success_rate` sees only the trained ones, selected for their signal."""
        names = sorted(counts)
        totals = self.accelerator.reduce(torch.tensor([counts[n] for n in names], device=self.accelerator.device),
                                         reduction="sum")
        summed = dict(zip(names, totals.tolist()))
        metrics = self.metrics[mode]
        metrics["dynamic_sampling/draws"].append(counts["draws"])  # the same on every process
        metrics["dynamic_sampling/tied_fraction"].append(summed["tied_groups"] / max(1.0, summed["groups_played"]))
        if summed["played_valid"]:
            metrics["dynamic_sampling/played_success_rate"].append(summed["played_won"] / summed["played_valid"])
        for name in names:
            if name not in ("draws", "tied_groups", "groups_played", "played_won", "played_valid"):
                metrics[f"dynamic_sampling/{name}"].append(summed[name])
