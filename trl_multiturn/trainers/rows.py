"""How a step's episodes become training rows, one object per episode format: the row indices, token lists and
trained masks TRL's rows take, the per-turn sums, values and advantages the credit maps onto them, and the value
targets of PPO's credit. Beside the step (`step.py`) and its batch (`batch.py`); what playing needs of a format
stays in `trl_multiturn.rollout.formats`.

- `TrajectoryRows` ("trajectory"): an episode is one training row (its turns' replies under the env mask).
- `StepRows` ("stepwise"): each turn is its own training row, a `StepSample` (its context as the model saw it, its
  reply as sampled), with its turn's credit; `steps_per_batch` draws them (`fit_steps`).

`ROW_LAYOUTS` maps the format an episode was played in (`EpisodeFormat.name`, as the runner that played it says:
`played_format`) to its layout; a `RolloutBatch` records the layout its rows follow (`RolloutBatch.layout`), so the
step and the credit ask the batch, never the config: an agent that rewrote its history hands step samples under the
trajectory rules.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from trl.trainer.utils import nanstd

from ..credit.gae import ValueBatch, ValueEstimator, ValueTargets, stepwise_value_targets

if TYPE_CHECKING:
    from ..rollout.episode import Episode


@dataclass(frozen=True)
class StepSample:
    """One turn of a step-wise episode as a training row: turn `turn` of episode `episode` (indices into the batch),
    its context ids exactly as the model saw them, its reply ids exactly as sampled, the loss mask of the reply and
    the behaviour log-probs."""

    episode: int
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]
    logprobs: list[float]


class TrajectoryRows:
    """An episode is one training row (see the module docstring). A method's `batch` is the `RolloutBatch` whose
    rows it lays out or credits."""

    name = "trajectory"

    def training_rows(self, rows: list[dict], batch, budget: int | None, multiple: int, rng: random.Random,
                      mask_truncated: bool) -> tuple[list[dict], Any]:
        """TRL's rows are the episodes' own."""
        return rows, batch

    def row_episodes(self, batch) -> list[Episode]:
        return batch.episodes

    def row_returns(self, batch, episode_return: Callable[[Episode], float | None]) -> list[float | None]:
        """Each row's environment return: its episode's."""
        return [episode_return(ep) for ep in batch.episodes]

    def row_turn_spans(self, batch) -> list[list[tuple[int, int]]]:
        return [ep.turn_spans for ep in batch.episodes]

    def token_lists(self, batch, pad_id: int, eos_id: int) -> list[tuple]:
        """A failed episode, or one with no reply, becomes a one-token prompt and completion under mask 0: it carries
        no loss, and its prompt (which may be what broke the episode budget) never reaches the model."""
        out = []
        for ep in batch.episodes:
            if ep.failed or not ep.completion_ids:
                out.append(([pad_id], [eos_id], [0], [math.nan]))
            else:
                out.append((ep.prompt_ids, ep.completion_ids, ep.env_mask, ep.logprobs))
        return out

    def trained_mask(self, batch, env_mask: list[list[int]], mask_truncated: bool) -> list[list[int]]:
        """`env_mask`, or nothing for a truncated episode when `mask_truncated`."""
        if not mask_truncated:
            return env_mask
        return [[0] * len(m) if ep.truncated else m for m, ep in zip(env_mask, batch.episodes)]

    def completion_id_lists(self, batch) -> list[list[int]]:
        return [ep.completion_ids for ep in batch.episodes]

    def completions(self, batch) -> list[list[dict]]:
        return [ep.messages()[len(ep.prompt_messages):] for ep in batch.episodes]

    def local_scores(self, batch) -> torch.Tensor | None:
        if batch.rewards_per_func is None:
            return None
        start = batch.process_index * len(batch.episodes)
        return batch.rewards_per_func[start: start + len(batch.episodes)]

    # -- credit ------------------------------------------------------------------------------------------------------

    def row_turn_advantages(self, batch, turn_advantages: torch.Tensor) -> torch.Tensor:
        """(rows, turns): the rows are the episodes, so their advantages as they are."""
        return turn_advantages

    def row_turn_values(self, batch, per_turn: list[list[float]]) -> list[list[float]]:
        """Per row, its turns' values (none for a failed episode)."""
        return [[] if ep.failed else values for ep, values in zip(batch.episodes, per_turn)]

    def turn_sums(self, batch, per_token: torch.Tensor) -> list[list[float]]:
        """Per episode and turn, the sum of `per_token` (rows, T) over the turn's span of its row."""
        return [[per_token[i, start:end].sum().item() for start, end in ep.turn_spans]
                for i, ep in enumerate(batch.episodes)]

    def log_reward_groups(self, metrics: dict, total: torch.Tensor, num_generations: int) -> None:
        """TRL's `frac_reward_zero_std`: the fraction of groups of `num_generations` rows whose reward does not
        vary."""
        groups = total.view(-1, num_generations)
        metrics["frac_reward_zero_std"].append(sum(
            bool(nanstd(group).nan_to_num(0.0) == 0) for group in groups) / len(groups))

    def value_targets(self, batch, estimator: ValueEstimator, rewards, values, mask, *, gamma: float, lam: float,
                      mask_truncated: bool, left_out_values) -> ValueTargets:
        """The value estimator over each row, an episode."""
        return estimator(ValueBatch(rewards, values, mask), gamma=gamma, lam=lam)


class StepRows:
    """Each turn of an episode is its own training row, a `StepSample` (see the module docstring)."""

    name = "stepwise"

    def training_rows(self, rows: list[dict], batch, budget: int | None, multiple: int, rng: random.Random,
                      mask_truncated: bool) -> tuple[list[dict], Any]:
        """TRL's rows become the step samples of the batch, sized by `budget` (`fit_steps`); a padding row carries
        its batch's first task and no return."""
        steps = fit_steps(batch.step_samples(mask_truncated), budget, multiple, rng)
        step_rows = [rows[s.episode] if s is not None else {**rows[0], "episode_return": None} for s in steps]
        return step_rows, dataclasses.replace(batch, layout=self, steps=steps)

    def row_episodes(self, batch) -> list[Episode]:
        """Each step's episode (a padding row: the first)."""
        return [batch.episodes[s.episode if s is not None else 0] for s in batch.steps]

    def row_returns(self, batch, episode_return: Callable[[Episode], float | None]) -> list[float | None]:
        """Each step's environment return, its episode's (a padding row: None)."""
        return [episode_return(batch.episodes[s.episode]) if s is not None else None for s in batch.steps]

    def row_turn_spans(self, batch) -> list[list[tuple[int, int]]]:
        """A step sample's one reply (none for padding)."""
        return [[(0, len(s.completion_ids))] if s is not None else [] for s in batch.steps]

    def token_lists(self, batch, pad_id: int, eos_id: int) -> list[tuple]:
        return [(s.prompt_ids, s.completion_ids, s.mask, s.logprobs) if s is not None
                else ([pad_id], [eos_id], [0], [math.nan]) for s in batch.steps]

    def trained_mask(self, batch, env_mask: list[list[int]], mask_truncated: bool) -> list[list[int]]:
        """`env_mask`: `RolloutBatch.step_samples` already masked truncated episodes when asked."""
        return env_mask

    def completion_id_lists(self, batch) -> list[list[int]]:
        return [s.completion_ids if s is not None else [] for s in batch.steps]

    def completions(self, batch) -> list[list[dict]]:
        """Each step's reply."""
        return [[{"role": "assistant", "content": batch.episodes[s.episode].replies[s.turn] if s else ""}]
                for s in batch.steps]

    def local_scores(self, batch) -> None:
        """None: the rows are steps, so their scores belong to no one episode (step-wise refuses trajectory
        `reward_funcs`)."""
        return None

    # -- credit ------------------------------------------------------------------------------------------------------

    def row_turn_advantages(self, batch, turn_advantages: torch.Tensor) -> torch.Tensor:
        """(rows, 1): each step sample takes its turn's advantage (padding 0)."""
        return turn_advantages.new_tensor([[float(turn_advantages[s.episode, s.turn]) if s is not None else 0.0]
                                           for s in batch.steps])

    def row_turn_values(self, batch, per_turn: list[list[float]]) -> list[list[float]]:
        """Per row, its step's turn value (none for padding)."""
        return [[per_turn[s.episode][s.turn]] if s is not None else [] for s in batch.steps]

    def turn_sums(self, batch, per_token: torch.Tensor) -> list[list[float]]:
        """Per episode and turn, the sum of `per_token` over its step's row; 0 for a turn that `steps_per_batch`
        left out of the rows."""
        sums = [[0.0] * ep.num_turns for ep in batch.episodes]
        for row, step in enumerate(batch.steps):
            if step is not None:
                sums[step.episode][step.turn] = per_token[row].sum().item()
        return sums

    def log_reward_groups(self, metrics: dict, total: torch.Tensor, num_generations: int) -> None:
        """Nothing: step rows make no groups of one task."""

    def value_targets(self, batch, estimator: ValueEstimator, rewards, values, mask, *, gamma: float, lam: float,
                      mask_truncated: bool, left_out_values) -> ValueTargets:
        """The estimator's (rows, T) targets for the step rows, run across every step of each episode
        (`credit.gae.stepwise_value_targets`), since a step's target needs the values of the steps after it and
        `steps_per_batch` may leave some of those out of the rows. A step left out is still its episode's next
        state: its values come from `left_out_values(steps)` (a critic pass of their own), its reward is its turn's
        (without the KL penalty: it has no log-probs), and it trains nothing. `rewards`, `values`, `mask`: the
        rows' own."""
        rows = {(s.episode, s.turn): row for row, s in enumerate(batch.steps) if s is not None}
        steps = batch.step_samples(mask_truncated)  # all of them, as `fit_steps` was given
        left_out = iter(left_out_values([s for s in steps if (s.episode, s.turn) not in rows]))
        step_rewards, step_values, step_masks = [], [], []
        for s in steps:
            n, row = len(s.completion_ids), rows.get((s.episode, s.turn))
            if row is not None:
                step_rewards.append(rewards[row, :n])
                step_values.append(values[row, :n])
                step_masks.append(mask[row, :n])
                continue
            step_rewards.append(rewards.new_zeros(n))
            step_rewards[-1][-1] = batch.turn_rewards[s.episode][s.turn]
            step_values.append(next(left_out))
            step_masks.append(mask.new_tensor(s.mask))
        per_step = stepwise_value_targets(estimator, [s.episode for s in steps], step_rewards, step_values,
                                          step_masks, gamma=gamma, lam=lam)
        targets = ValueTargets(values.new_zeros(values.shape), values.new_zeros(values.shape),
                               mask.new_zeros(mask.shape))
        for s, step_targets in zip(steps, per_step):
            row = rows.get((s.episode, s.turn))
            if row is not None:
                for whole, part in zip(targets, step_targets):
                    whole[row, :len(part)] = part
        return targets


def fit_steps(samples: list[StepSample], budget: int | None, multiple: int, rng: random.Random) -> list[
        StepSample | None]:
    """The step samples of one generation batch as TRL's rows: with a `budget`, exactly `budget` rows (a uniformly
    drawn subset of `samples`, kept in order, when there are more; padded with None when fewer); without one, every
    sample, padded with None up to a multiple of `multiple` (TRL groups rows by num_generations and splits them into
    steps_per_generation equal parts). Every step has the same chance to be trained, so dropping steps biases no
    estimator."""
    if budget is not None and len(samples) > budget:
        samples = [samples[i] for i in sorted(rng.sample(range(len(samples)), budget))]
    size = budget if budget is not None else max(multiple, -(-len(samples) // multiple) * multiple)
    return [*samples, *[None] * (size - len(samples))]


ROW_LAYOUTS: dict[str, Any] = {TrajectoryRows.name: TrajectoryRows, StepRows.name: StepRows}
"""The row layouts by the name of the episode format the episodes were played in (`EpisodeFormat.name`)."""


def row_layout(format_name: str) -> TrajectoryRows | StepRows:
    """The row layout of episodes played in the format `format_name`."""
    return ROW_LAYOUTS[format_name]()
