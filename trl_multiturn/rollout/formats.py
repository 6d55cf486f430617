"""Episode formats: how an episode's turns are played, one object per format.

`EpisodeRules.episode_format_strategy()` chooses the format from the rules (`episode_format`, `history`), the one
place their strings are read (`FORMATS`); the runner, the agents' runner and the trainers' set-up call its methods:

- `Trajectory` ("trajectory"): one growing token sequence per episode, each observation appended as the chat
  template's delta for a new message.
- `StepWise` ("stepwise"): each turn's context is rendered whole by the chat template from the `history` policy's
  view of the episode (`trl_multiturn.rollout.history`) and recorded as the turn's `Turn.context`.

What a format decides, in the order an episode meets it:

    playing      token_builder, check_observation_role, start, context, context_length, turn_context, observe
    agents       as_played (an agent that rewrote its history), agent_episode
    set-up       check_config (the trainer config), prepare_trainer (the trainer's template, refusals)

What training rows the played episodes become (a row per episode, or per step) is the trainers' side:
`trl_multiturn.trainers.rows`, chosen by the format's `name`. This module imports neither the credit nor TRL's
training utilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from .chat_tokens import ChatTokenBuilder
from .episode import Episode
from .history import History, full, get_history
from .training_template import prepare_chat_template, read_chat_template


class EpisodeFormat(Protocol):
    """What differs between the episode formats (see the module docstring); `Trajectory` and `StepWise` implement
    it. `name` is the config's spelling (`episode_format`), `label` the logs'. A method's `runner` is the
    `EpisodeRunner` playing the episode; `trainer` the multi-turn trainer being set up."""

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

FORMATS: dict[str, Any] = {Trajectory.name: Trajectory, StepWise.name: StepWise}
"""The formats by their config spelling (`EpisodeRules.episode_format`)."""


def episode_format(name: str, history: str | History) -> EpisodeFormat:
    """The format `name` with the `history` policy (checked: a bad one, or one given to the trajectory format,
    raises naming it)."""
    return FORMATS[name].from_history(history)
