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

After the step the trainer keeps the batch as `last_rollout`, for inspection only (tests, benchmarks, callbacks);
no computation of a later step reads it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import torch

from .episode import Episode


@dataclass(frozen=True)
class StepSample:
    """One turn of a step-wise episode as a training sample: turn `turn` of episode `episode` (indices into the
    batch), its context ids exactly as the model saw them, its reply ids exactly as sampled, the loss mask of the
    reply and the behaviour log-probs."""

    episode: int
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]
    logprobs: list[float]


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
    steps: list[StepSample | None] | None = None
    policy_versions: list[int] | None = None

    def __len__(self) -> int:
        return len(self.episodes)

    def with_steps(self, steps: list[StepSample | None]) -> RolloutBatch:
        """This batch with TRL's rows made of `steps` (step-wise format)."""
        return replace(self, steps=steps)

    def row_turn_spans(self) -> list[list[tuple[int, int]]]:
        """Per TRL row, the spans of its turns' sampled tokens in its completion: an episode's `turn_spans`, or a
        step sample's one reply (none for padding)."""
        if self.steps is None:
            return [ep.turn_spans for ep in self.episodes]
        return [[(0, len(s.completion_ids))] if s is not None else [] for s in self.steps]

    def with_scores(self, rewards_per_func: torch.Tensor | None) -> RolloutBatch:
        """This batch with TRL's `rewards_per_func` (gathered over ranks) recorded."""
        return replace(self, rewards_per_func=rewards_per_func)

    def local_scores(self) -> torch.Tensor | None:
        """The rows of `rewards_per_func` that belong to this rank's episodes (None before scoring)."""
        if self.rewards_per_func is None:
            return None
        start = self.process_index * len(self.episodes)
        return self.rewards_per_func[start: start + len(self.episodes)]

    def token_lists(self, pad_id: int, eos_id: int) -> list[tuple[list[int], list[int], list[int], list[float]]]:
        """Per episode: (prompt_ids, completion_ids, env_mask, logprobs). A failed episode, or one with no reply,
        becomes a one-token prompt and completion under mask 0: it carries no loss, and its prompt (which may be
        what broke the episode budget) never reaches the model. Step-wise: per step sample, padding alike."""
        if self.steps is not None:
            return [(s.prompt_ids, s.completion_ids, s.mask, s.logprobs) if s is not None
                    else ([pad_id], [eos_id], [0], [math.nan]) for s in self.steps]
        out = []
        for ep in self.episodes:
            if ep.failed or not ep.completion_ids:
                out.append(([pad_id], [eos_id], [0], [math.nan]))
            else:
                out.append((ep.prompt_ids, ep.completion_ids, ep.env_mask, ep.logprobs))
        return out

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
        """Per episode, the tokens the loss trains on: `env_mask`, or nothing for a truncated episode when
        `mask_truncated` (the config's `mask_truncated_completions`) is set (step-wise: `step_samples` did)."""
        if not mask_truncated or self.steps is not None:
            return env_mask
        return [[0] * len(m) if ep.truncated else m for m, ep in zip(env_mask, self.episodes)]

    def completion_id_lists(self) -> list[list[int]]:
        """Per TRL row, the ids of its completion as the reward functions are given them: an episode's whole
        completion, or a step's reply (none for padding)."""
        if self.steps is None:
            return [ep.completion_ids for ep in self.episodes]
        return [s.completion_ids if s is not None else [] for s in self.steps]

    def completions(self) -> list[list[dict]]:
        """The whole episode after its prompt, as chat messages (what reward functions and completion logs see);
        step-wise: each step's reply."""
        if self.steps is not None:
            return [[{"role": "assistant", "content": self.episodes[s.episode].replies[s.turn] if s else ""}]
                    for s in self.steps]
        return [ep.messages()[len(ep.prompt_messages):] for ep in self.episodes]


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
