"""`RolloutBatch`: one training step's rollout on this rank, handed from the rollout to the credit and the loss.

The trainers' step (`trl_multiturn.trainers.step.MultiTurnStep`, which TRL calls as
`_generate_and_score_completions`) passes it from stage to stage as an argument:

1. The rollout plays the episodes and returns TRL's rows (the task rows, with each episode's opening messages as
   `prompt`) and a `RolloutBatch`: the episodes, their per-turn credit rewards, the reward weights, the group size
   and the mode (step-wise: the step samples that are the rows).
2. The scores of every reward source (the environment's return, then each `reward_funcs`) are recorded on the batch
   (`with_scores`), and the credit turns the batch into per-token advantages.
3. The loss reads only the step's output dict: `advantages`, and PPO's `returns`, `old_values`, `value_mask`, all
   tensors, which TRL shuffles and splits into the loss's mini-batches. The batch itself never enters that dict: TRL
   permutes and slices every value of it per row, and an episode list is not a per-row tensor.

The step keeps its last batch (the trainer's `last_rollout`), for inspection only (tests, benchmarks, callbacks); no
computation of a later step reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..rollout.episode import Episode
from .rows import StepRows, StepSample, TrajectoryRows


@dataclass(frozen=True, eq=False)
class RolloutBatch:
    """The episodes this rank played in one step and what the credit needs of them.

    episodes: this rank's episodes, in the order of TRL's rows (groups of `num_generations` consecutive rows play
        one task; a group may span ranks).
    turn_rewards: per episode, per turn, the environment's reward under `reward_mode` times `reward_weights[0]`.
    reward_weights: TRL's weights of its reward sources: the environment's return first, then each `reward_funcs`.
    num_generations: the group size of this step (TRL's `num_generations`, or `num_generations_eval`).
    mode: "train" or "eval".
    process_index: this rank; its episodes are rows `process_index * len(episodes) ...` of gathered tensors.
    rewards_per_func: TRL's (all ranks' episodes, reward sources) scores once they are computed, else None.
    layout: how TRL's rows lay out the episodes (`rows.py`): `TrajectoryRows` (a row per episode) or `StepRows` (a
        row per step sample: `steps`); its `training_rows` sets both.
    steps: step-wise format: TRL's rows are these step samples (None: padding, trained on nothing), not the
        episodes; None in the trajectory format.
    policy_versions: `max_policy_lag`: per episode, the version of the weights that sampled it (the optimizer steps
        they had taken); None when the live policy did.
    """

    episodes: list[Episode]
    turn_rewards: list[list[float]]
    reward_weights: torch.Tensor
    num_generations: int
    mode: str = "train"
    process_index: int = 0
    rewards_per_func: torch.Tensor | None = None
    layout: TrajectoryRows | StepRows = field(default_factory=TrajectoryRows)
    steps: list[StepSample | None] | None = None
    policy_versions: list[int] | None = None

    def __len__(self) -> int:
        return len(self.episodes)

    def row_turn_spans(self) -> list[list[tuple[int, int]]]:
        """Per TRL row, the spans of its turns' sampled tokens in its completion: an episode's `turn_spans`, or a
        step sample's one reply (none for padding)."""
        return self.layout.row_turn_spans(self)

    def with_scores(self, rewards_per_func: torch.Tensor | None) -> RolloutBatch:
        """This batch with TRL's `rewards_per_func` (gathered over ranks) recorded."""
        return replace(self, rewards_per_func=rewards_per_func)

    def local_scores(self) -> torch.Tensor | None:
        """The rows of `rewards_per_func` that belong to this rank's episodes (None before scoring, and for step
        rows, whose scores belong to no one episode)."""
        return self.layout.local_scores(self)

    def token_lists(self, pad_id: int, eos_id: int) -> list[tuple[list[int], list[int], list[int], list[float]]]:
        """Per TRL row: (prompt_ids, completion_ids, env_mask, logprobs). A failed episode, one with no reply, and a
        padding row become a one-token prompt and completion under mask 0."""
        return self.layout.token_lists(self, pad_id, eos_id)

    def step_samples(self, mask_truncated: bool = False) -> list[StepSample]:
        """Step-wise format: one training sample per turn of every episode that did not fail, in episode then
        turn order. Its prompt is the context the turn was generated from, its completion the reply as sampled,
        its mask 1 on every reply token (0 for a truncated episode when `mask_truncated`)."""
        out = []
        for i, ep in enumerate(self.episodes):
            if ep.failed:
                continue
            trained = 0 if mask_truncated and ep.truncated else 1
            for k, (start, end) in enumerate(ep.turn_spans):
                out.append(StepSample(i, k, ep.step_contexts[k], ep.completion_ids[start:end],
                                      [trained] * (end - start), ep.logprobs[start:end]))
        return out

    def trained_mask(self, env_mask: list[list[int]], mask_truncated: bool) -> list[list[int]]:
        """Per TRL row, the tokens the loss trains on: `env_mask`, or nothing for a truncated episode when
        `mask_truncated` (the config's `mask_truncated_completions`) is set (step-wise: `step_samples` did)."""
        return self.layout.trained_mask(self, env_mask, mask_truncated)

    def completion_id_lists(self) -> list[list[int]]:
        """Per TRL row, the ids of its completion as the reward functions are given them: an episode's whole
        completion, or a step's reply (none for padding)."""
        return self.layout.completion_id_lists(self)

    def completions(self) -> list[list[dict]]:
        """The whole episode after its prompt, as chat messages (what reward functions and completion logs see);
        step-wise: each step's reply."""
        return self.layout.completions(self)
