"""The step's episode source: plays one episode per task row (or takes the rollout played in the background under
`max_policy_lag`, or, under `dynamic_sampling`, draws tasks until the groups have rewards that differ: see
`dynamic_sampling.py`), saves the episodes if asked, shapes their rewards under `reward_mode`, and lays them out as
TRL's rows of the step's `RolloutBatch`; it also says which sampled tokens the loss trains on."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Callable

from ..credit import shape_turn_rewards
from ..episode_data import save_episodes
from .batch import RolloutBatch
from .policy_lag import LaggedRollouts, stale_episodes
from .rows import row_layout

if TYPE_CHECKING:
    from ..agents import AgentRunner
    from ..rollout import Episode, EpisodeRunner
    from .dynamic_sampling import DynamicSampler
    from .generation_backend import GenerationBackend
    from .step_log import StepLog


class EpisodeSource:
    """`runner` plays a list of task rows and says which format they were played in (`played_format`), through
    `generation` (`generation_backend.GenerationBackend`: its `rollout()` is the context a whole rollout runs in);
    `lagged` the off-policy schedule of `max_policy_lag` (None: on-policy). `training()` says whether the model is in
    training mode, `state()` gives the trainer's current `TrainerState`; `reward_weights` and the group sizes are the
    trainer's; `dynamic`: the training rollouts' dynamic sampling (None: off)."""

    def __init__(self, runner: EpisodeRunner | AgentRunner, args, accelerator, *,
                 generation: GenerationBackend, lagged: LaggedRollouts | None, training: Callable[[], bool],
                 state: Callable, reward_weights, num_generations: int, num_generations_eval: int, log: StepLog,
                 dynamic: DynamicSampler | None = None):
        self.runner, self.args, self.accelerator = runner, args, accelerator
        self.generation, self.lagged = generation, lagged
        self.training, self.state, self.reward_weights = training, state, reward_weights
        self.num_generations, self.num_generations_eval, self.log = num_generations, num_generations_eval, log
        self.dynamic = dynamic

    def __call__(self, inputs: list[dict]) -> tuple[list[dict], RolloutBatch]:
        """Play one episode per row. Returns TRL's rows (each with its episode's opening messages as `prompt`) and
        the step's `RolloutBatch`. With `max_policy_lag`, training takes the rollout played in the background
        (`LaggedRollouts`: the rows are those it played) and starts the next one on `inputs`. With dynamic sampling,
        training plays further draws of tasks, and the rows are the groups it keeps."""
        mode = "train" if self.training() else "eval"
        versions, dropped = None, []
        if mode == "train" and self.lagged is not None:
            inputs, episodes, version = self.lagged.take(inputs, self.state().global_step)
            versions = [version] * len(episodes)
        elif mode == "train" and self.dynamic is not None:
            draws = self.dynamic(inputs, self.play, self.episode_return, self.state().global_step)
            inputs, episodes, dropped = draws.rows, draws.episodes, draws.dropped
            played = [ep for ep in episodes + dropped if not ep.failed]
            self.log.dynamic_sampling(mode, {**draws.counts, "played_valid": float(len(played)),
                                             "played_won": float(sum(ep.won for ep in played))})
        else:
            episodes = self.play(inputs)
        if self.args.save_episodes:
            name = f"{mode}-step-{self.state().global_step}-rank{self.accelerator.process_index}"
            save_episodes(episodes, self.args.output_dir, name)
            if dropped:
                save_episodes(dropped, self.args.output_dir, f"{name}-dropped")
        batch = RolloutBatch(
            episodes=episodes,
            turn_rewards=[self.credit_turn_rewards(ep) for ep in episodes],
            reward_weights=self.reward_weights,
            num_generations=self.num_generations if mode == "train" else self.num_generations_eval,
            mode=mode,
            process_index=self.accelerator.process_index,
            policy_versions=versions,
        )
        if versions is not None:
            self.log.policy_lag(batch, self.stale(batch))
        rows = []
        for row, ep in zip(inputs, episodes):
            prompt = ep.prompt_messages or [{"role": "user", "content": ""}]
            rows.append({**row, "prompt": prompt, "episode_return": self.episode_return(ep), "won": ep.won,
                         "num_turns": ep.num_turns})
        played = self.runner.played_format(episodes)  # an agent's rollout may come as step samples
        return row_layout(played.name).training_rows(rows, batch, *self.step_budget(batch.mode), self.step_rng(),
                                                     self.args.mask_truncated_completions)

    def play(self, inputs: list[dict]) -> list[Episode]:
        """One episode per row, played by the live policy."""
        with self.generation.rollout():
            return self.runner(inputs)

    def step_budget(self, mode: str) -> tuple[int | None, int]:
        """Step-wise rows: (how many each process trains on, None for every step; the multiple of rows padded to).
        Training: `steps_per_batch` whole groups of `num_generations` per optimizer step; evaluation: every step, in
        whole groups."""
        if mode == "train":
            return self.args.steps_per_batch, self.num_generations * self.args.steps_per_generation
        return None, self.num_generations_eval

    def step_rng(self) -> random.Random:
        """The draw of step-wise rows under `steps_per_batch`: seeded per run, step and process."""
        return random.Random(f"{self.args.seed}-{self.state().global_step}-{self.accelerator.process_index}")

    # -- rewards ------------------------------------------------------------------------------------------------------

    def shaped_rewards(self, ep: Episode) -> list[float]:
        args = self.args
        return shape_turn_rewards(ep.turn_rewards, ep.won, args.reward_mode, args.success_reward, ep.format_errors,
                                  args.format_penalty)

    def credit_turn_rewards(self, ep: Episode) -> list[float]:
        """The per-turn rewards the credit is given: the environment's, under `reward_mode`, times its weight
        `reward_weights[0]` (trajectory `reward_funcs` are added, weighted, by the credit)."""
        weight = float(self.reward_weights[0])
        return [weight * r for r in self.shaped_rewards(ep)]

    def episode_return(self, ep: Episode) -> float | None:
        return None if ep.failed else float(sum(self.shaped_rewards(ep)))

    # -- the trained tokens -------------------------------------------------------------------------------------------

    def trained_mask(self, batch: RolloutBatch, env_mask: list[list[int]]) -> list[list[int]]:
        """`batch.trained_mask` under the config's `mask_truncated_completions`, without the episodes sampled more
        than `max_policy_lag` optimizer steps ago (`stale`)."""
        mask = batch.trained_mask(env_mask, self.args.mask_truncated_completions)
        if batch.policy_versions is None:  # on-policy (step-wise batches among them: rows are step samples)
            return mask
        return [[0] * len(m) if stale else m for m, stale in zip(mask, self.stale(batch))]

    def stale(self, batch: RolloutBatch) -> list[bool]:
        """Per episode of `batch` (sampled by a snapshot), whether it was sampled more than `max_policy_lag` optimizer
        steps ago."""
        return stale_episodes(batch.policy_versions, self.state().global_step, self.args.max_policy_lag)
