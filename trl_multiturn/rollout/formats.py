"""Episode formats: how an episode's turns are played and what training rows it becomes, one object per format.

`EpisodeRules.episode_format_strategy()` chooses the format from the rules (`episode_format`, `history`), the one
place their strings are read (`FORMATS`); the runner, the agents' runner, the trainers' step and their credit call
its methods:

- `Trajectory` ("trajectory"): one growing token sequence per episode, each observation appended as the chat
  template's delta for a new message; the episode is one training row (its turns' replies under the env mask).
- `StepWise` ("stepwise"): each turn's context is rendered whole by the chat template from the `history` policy's
  view of the episode (`trl_multiturn.rollout.history`), and each turn is its own training row, a `StepSample`
  (its context as the model saw it, its reply as sampled), with its turn's credit.

What a format decides, in the order an episode meets it:

    playing      token_builder, check_observation_role, start, context, context_length, turn_context, observe
    agents       as_played (an agent that rewrote its history), agent_episode
    set-up       check_config (the trainer config), prepare_trainer (the trainer's template, refusals)
    rows         training_rows (episodes -> TRL's rows), row_episodes, row_turn_spans, token_lists, trained_mask,
                 completion_id_lists, completions, local_scores
    credit       row_turn_advantages, row_turn_values, turn_sums, log_reward_groups (GRPO / RLOO), value_targets
                 (PPO: GAE within each episode's row, or chained across its steps)

A `RolloutBatch` records the format its rows follow (`RolloutBatch.format`), so the step and the credit ask the
batch, never the config: an agent that rewrote its history hands step samples under the trajectory rules.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .chat_tokens import ChatTokenBuilder
from .episode import Episode
from .history import History, full, get_history
from .training_template import prepare_chat_template, read_chat_template

if TYPE_CHECKING:
    import torch

    from ..credit.gae import ValueEstimator, ValueTargets


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


class EpisodeFormat(Protocol):
    """What differs between the episode formats (see the module docstring); `Trajectory` and `StepWise` implement
    it. `name` is the config's spelling (`episode_format`), `label` the logs'. A method's `batch` is the
    `RolloutBatch` whose rows it lays out or credits; `runner` the `EpisodeRunner` playing the episode; `trainer`
    the multi-turn trainer being set up."""

    name: str
    label: str

    def token_builder(self, tokenizer, eos_token_ids, chat_template_kwargs) -> ChatTokenBuilder: ...
    def check_observation_role(self, tokens: ChatTokenBuilder, role: str) -> None: ...
    def start(self, ep: Episode) -> None: ...
    def context(self, ep: Episode) -> list[int]: ...
    def context_length(self, ep: Episode) -> int: ...
    def turn_context(self, context: list[int]) -> list[int] | None: ...
    def observe(self, runner, ep: Episode, observation: str, role: str) -> None: ...
    def as_played(self, rewritten_history: bool) -> EpisodeFormat: ...
    def agent_episode(self, record, turn_rewards: list[float], won: bool, truncated: bool) -> Episode: ...
    def check_config(self, config) -> None: ...
    def prepare_trainer(self, trainer) -> None: ...
    def training_rows(self, rows: list[dict], batch, budget: int | None, multiple: int, rng: random.Random,
                      mask_truncated: bool) -> tuple[list[dict], Any]: ...
    def row_episodes(self, batch) -> list[Episode]: ...
    def row_turn_spans(self, batch) -> list[list[tuple[int, int]]]: ...
    def token_lists(self, batch, pad_id: int, eos_id: int) -> list[tuple]: ...
    def trained_mask(self, batch, env_mask: list[list[int]], mask_truncated: bool) -> list[list[int]]: ...
    def completion_id_lists(self, batch) -> list[list[int]]: ...
    def completions(self, batch) -> list[list[dict]]: ...
    def local_scores(self, batch) -> torch.Tensor | None: ...
    def row_turn_advantages(self, batch, turn_advantages: torch.Tensor) -> torch.Tensor: ...
    def row_turn_values(self, batch, per_turn: list[list[float]]) -> list[list[float]]: ...
    def turn_sums(self, batch, per_token: torch.Tensor) -> list[list[float]]: ...
    def log_reward_groups(self, metrics: dict, total: torch.Tensor, num_generations: int) -> None: ...
    def value_targets(self, batch, estimator: ValueEstimator, rewards, values, mask, *, gamma: float, lam: float,
                      mask_truncated: bool, left_out_values) -> ValueTargets: ...


class Trajectory:
    """One growing token sequence per episode, trained as one row (see the module docstring)."""

    name = "trajectory"
    label = "trajectory"

    @classmethod
    def from_history(cls, history: str | History) -> Trajectory:
        """The trajectory format; a `history` other than 'full' is refused (it only applies step-wise)."""
        if history != "full":
            raise ValueError(f"history={history!r} only applies to episode_format='stepwise' (these rules have "
                             f"episode_format={cls.name!r}): set episode_format='stepwise' or leave history at "
                             "'full'")
        return cls()

    # -- playing -----------------------------------------------------------------------------------------------------

    def token_builder(self, tokenizer, eos_token_ids, chat_template_kwargs) -> ChatTokenBuilder:
        """A token builder that extends the conversation turn by turn (its template checked for that)."""
        return ChatTokenBuilder(tokenizer, eos_token_ids, chat_template_kwargs, extend_turns=True)

    def check_observation_role(self, tokens: ChatTokenBuilder, role: str) -> None:
        """Refuse a template that cannot append an observation in `role` (now, not at the first observation)."""
        if role != "user":
            tokens.check_observation_role(role)

    def start(self, ep: Episode) -> None:
        """Nothing to set: the next context is the prompt and the completion so far."""

    def context(self, ep: Episode) -> list[int]:
        """The tokens the episode's next reply is generated from: the whole episode so far."""
        return ep.prompt_ids + ep.completion_ids

    def context_length(self, ep: Episode) -> int:
        return ep.num_tokens  # no list copied per turn

    def turn_context(self, context: list[int]) -> None:
        """A turn keeps no context of its own: it is the episode's tokens before its span."""
        return None

    def observe(self, runner, ep: Episode, observation: str, role: str) -> None:
        """Append the observation as the template's delta for a new message (the reply closed first), or end the
        episode as truncated when the observation exceeds `max_observation_tokens` or leaves no room for a reply
        within `max_episode_tokens`."""
        turn = ep.turns[-1]
        start, end = turn.span
        appended = runner.tokens.close_ids(ep.completion_ids[start:end])
        observation_ids = runner.tokens.observation_ids(observation, role)
        appended += observation_ids
        reason = runner.over_observation_cap(len(observation_ids))
        if reason is not None:
            turn.info = {**turn.info, "truncation": reason}
            ep.truncate()
            return
        cap = runner.rules.max_episode_tokens
        if cap is not None and ep.num_tokens + len(appended) >= cap:
            ep.truncate()  # no room left for the observation and a reply after it
            return
        ep.completion_ids += appended
        ep.env_mask += [0] * len(appended)
        ep.logprobs += [math.nan] * len(appended)

    # -- agents ------------------------------------------------------------------------------------------------------

    def as_played(self, rewritten_history: bool) -> EpisodeFormat:
        """The format episodes come in: step-wise when some episode's history was rewritten (an agent's template or
        framework edited earlier messages, so its contexts do not extend one another), else this one."""
        return StepWise() if rewritten_history else self

    def agent_episode(self, record, turn_rewards: list[float], won: bool, truncated: bool) -> Episode:
        """An agent's recorded calls as one episode (`agents.recording.EpisodeRecord.episode`)."""
        return record.episode(turn_rewards, won, truncated)

    # -- set-up ------------------------------------------------------------------------------------------------------

    def check_config(self, config) -> None:
        """Refuse `steps_per_batch`, a step-wise field."""
        if config.steps_per_batch is not None:
            raise ValueError(f"steps_per_batch={config.steps_per_batch!r} only applies to episode_format='stepwise' "
                             f"(this config has episode_format={self.name!r}): set episode_format='stepwise' or "
                             "leave it at its default (None)")

    def prepare_trainer(self, trainer) -> None:
        """Give the trainer's tokenizer the template it trains with, checked for turn-by-turn extension
        (`training_template.prepare_chat_template`)."""
        args = trainer.args
        prepare_chat_template(trainer.text_tokenizer, args.chat_template_path, args.use_training_chat_template,
                              trainer.stop_token_ids, trainer.chat_template_kwargs)

    # -- rows --------------------------------------------------------------------------------------------------------

    def training_rows(self, rows: list[dict], batch, budget: int | None, multiple: int, rng: random.Random,
                      mask_truncated: bool) -> tuple[list[dict], Any]:
        """TRL's rows are the episodes' own."""
        return rows, batch

    def row_episodes(self, batch) -> list[Episode]:
        return batch.episodes

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
        from trl.trainer.utils import nanstd

        groups = total.view(-1, num_generations)
        metrics["frac_reward_zero_std"].append(sum(
            bool(nanstd(group).nan_to_num(0.0) == 0) for group in groups) / len(groups))

    def value_targets(self, batch, estimator: ValueEstimator, rewards, values, mask, *, gamma: float, lam: float,
                      mask_truncated: bool, left_out_values) -> ValueTargets:
        """The value estimator over each row, an episode."""
        from ..credit.gae import ValueBatch

        return estimator(ValueBatch(rewards, values, mask), gamma=gamma, lam=lam)


@dataclass(frozen=True)
class StepWise:
    """Each turn's context rendered whole from the `history` policy's view of the episode, each turn a training row
    (see the module docstring).

    Playing: the context is recorded as the turn's `Turn.context`; `completion_ids` holds the sampled replies only
    (`env_mask` all 1), so turn k's row is `step_contexts[k]` followed by its span of `completion_ids`. The template
    is used as it is at inference, one that rewrites history included; it is never checked for turn-by-turn
    extension. `max_episode_tokens` caps each step's context plus its reply (not the episode), and
    `max_observation_tokens` counts an observation's own tokens (without the template's).
    """

    history: History = full
    name = "stepwise"
    label = "step-wise"

    @classmethod
    def from_history(cls, history: str | History) -> StepWise:
        return cls(get_history(history))

    # -- playing -----------------------------------------------------------------------------------------------------

    def token_builder(self, tokenizer, eos_token_ids, chat_template_kwargs) -> ChatTokenBuilder:
        """A token builder that renders each context whole: any template works, as at inference."""
        return ChatTokenBuilder(tokenizer, eos_token_ids, chat_template_kwargs, extend_turns=False)

    def check_observation_role(self, tokens: ChatTokenBuilder, role: str) -> None:
        """Nothing to check: the template renders every role as it does at inference."""

    def start(self, ep: Episode) -> None:
        ep.next_context = ep.prompt_ids

    def context(self, ep: Episode) -> list[int]:
        return ep.next_context

    def context_length(self, ep: Episode) -> int:
        return len(ep.next_context)

    def turn_context(self, context: list[int]) -> list[int]:
        return context

    def observe(self, runner, ep: Episode, observation: str, role: str) -> None:
        """Render the next turn's context from the History policy's view of the episode, or end the episode as
        truncated when the observation or the context leaves no room within the caps."""
        tokens = len(runner.tokenizer.encode(observation, add_special_tokens=False))
        reason = runner.over_observation_cap(tokens)
        if reason is not None:
            ep.turns[-1].info = {**ep.turns[-1].info, "truncation": reason}
            ep.truncate()
            return
        exchanged = ep.messages()[len(ep.prompt_messages):]
        turns = [exchanged[k: k + 2] for k in range(0, len(exchanged), 2)]
        context = runner.tokens.prompt_ids(self.history(list(ep.prompt_messages), turns))
        cap = runner.rules.max_episode_tokens
        if cap is not None and len(context) >= cap:
            ep.truncate()  # no room left for a reply after this context
            return
        ep.next_context = context

    # -- agents ------------------------------------------------------------------------------------------------------

    def as_played(self, rewritten_history: bool) -> EpisodeFormat:
        return self

    def agent_episode(self, record, turn_rewards: list[float], won: bool, truncated: bool) -> Episode:
        """Every agent call as a step sample (`agents.recording.EpisodeRecord.stepwise_episode`)."""
        return record.stepwise_episode(turn_rewards, won, truncated)

    # -- set-up ------------------------------------------------------------------------------------------------------

    def check_config(self, config) -> None:
        """Refuse a `steps_per_batch` that does not split into `steps_per_generation` equal parts."""
        per_generation = getattr(config, "steps_per_generation", None) or 1
        if config.steps_per_batch is not None and config.steps_per_batch % per_generation:
            raise ValueError(f"steps_per_batch={config.steps_per_batch} must be a multiple of steps_per_generation="
                             f"{per_generation} (each optimizer step trains on an equal share of the step samples)")

    def prepare_trainer(self, trainer) -> None:
        """Refuse what the step-wise format does not support yet, naming the fix; the template, if given, is used
        as it is (contexts are rendered whole)."""
        args = trainer.args
        if len(trainer.reward_funcs) > 1:
            raise ValueError("episode_format='stepwise' takes its rewards from the environment only (per turn); "
                             "trajectory-level reward_funcs are not supported there yet: drop reward_funcs or use "
                             "episode_format='trajectory'")
        if args.chat_template_path:
            trainer.text_tokenizer.chat_template = read_chat_template(args.chat_template_path)
        budget, processes = args.steps_per_batch, trainer.accelerator.num_processes
        if budget is None and processes > 1:
            raise ValueError(f"episode_format='stepwise' on {processes} processes needs steps_per_batch (every "
                             "process must hand TRL the same number of step samples): set it to a multiple of "
                             "steps_per_generation whose product with the number of processes is a multiple of "
                             "num_generations")
        if budget is not None and (budget * processes) % trainer.num_generations:
            raise ValueError(f"steps_per_batch={budget} times {processes} process(es) must be a multiple of "
                             f"num_generations={trainer.num_generations} (TRL groups its rows by num_generations)")

    # -- rows --------------------------------------------------------------------------------------------------------

    def training_rows(self, rows: list[dict], batch, budget: int | None, multiple: int, rng: random.Random,
                      mask_truncated: bool) -> tuple[list[dict], Any]:
        """TRL's rows become the step samples of the batch, sized by `budget` (`fit_steps`); a padding row carries
        its batch's first task and no return."""
        steps = fit_steps(batch.step_samples(mask_truncated), budget, multiple, rng)
        step_rows = [rows[s.episode] if s is not None else {**rows[0], "episode_return": None} for s in steps]
        return step_rows, dataclasses.replace(batch, format=self, steps=steps)

    def row_episodes(self, batch) -> list[Episode]:
        """Each step's episode (a padding row: the first)."""
        return [batch.episodes[s.episode if s is not None else 0] for s in batch.steps]

    def row_turn_spans(self, batch) -> list[list[tuple[int, int]]]:
        """A step sample's one reply (none for padding)."""
        return [[(0, len(s.completion_ids))] if s is not None else [] for s in batch.steps]

    def token_lists(self, batch, pad_id: int, eos_id: int) -> list[tuple]:
        return [(s.prompt_ids, s.completion_ids, s.mask, s.logprobs) if s is not None
                else ([pad_id], [eos_id], [0], [math.nan]) for s in batch.steps]

    def trained_mask(self, batch, env_mask: list[list[int]], mask_truncated: bool) -> list[list[int]]:
        """`env_mask`: `step_samples` already masked truncated episodes when asked."""
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
        from ..credit.gae import ValueTargets, stepwise_value_targets

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


FORMATS: dict[str, Any] = {Trajectory.name: Trajectory, StepWise.name: StepWise}
"""The formats by their config spelling (`EpisodeRules.episode_format`)."""


def episode_format(name: str, history: str | History) -> EpisodeFormat:
    """The format `name` with the `history` policy (checked: a bad one, or one given to the trajectory format,
    raises naming it)."""
    return FORMATS[name].from_history(history)
