"""The multi-turn episode runner: plays a batch of episodes turn by turn against an environment."""

from __future__ import annotations

import functools
import itertools
import logging
import math
from typing import Callable, Sequence

from ..envs.base import EnvironmentFactory, StepResult
from .env_pool import EnvFailure, EnvPool, PendingCalls, declared
from .episode import Episode, Turn
from .formats import EpisodeFormat
from .parsing import get_action_parser
from .rules import EpisodeRules

logger = logging.getLogger(__name__)

# generate_fn(contexts, max_new_tokens) -> (completions, logprobs or None); one completion per context.
GenerateFn = Callable[[list[list[int]], int], "tuple[list[list[int]], list[list[float]] | None]"]

UNREADABLE_REPLY = "I could not find an action in your reply. Answer with the action only."
ROLLOUT_SCHEDULES = ("turn", "episode")


def check_schedule(schedule: str, overlap: bool) -> None:
    """Refuse a rollout schedule that does not exist, or one combined with `rollout_overlap`."""
    if schedule not in ROLLOUT_SCHEDULES:
        raise ValueError(f"rollout_schedule={schedule!r}: choose one of {ROLLOUT_SCHEDULES}")
    if schedule == "episode" and overlap:
        raise ValueError("rollout_schedule='episode' with rollout_overlap=True: choose one. Episode scheduling "
                         "already runs every episode's environment step while the model generates for the others; "
                         "set rollout_overlap=False (or rollout_schedule='turn' to keep the two halves)")


def opening_messages(first_observation: str, system_prompt: str | None = None) -> list[dict]:
    """The messages every episode starts from (RL rollouts and SFT trajectories alike)."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": first_observation}]


class EpisodeRunner:
    """Turns dataset rows (one task each) into played `Episode`s.

    Each turn makes exactly one `generate_fn` call for all live episodes (with `overlap`, one per half; with
    `schedule="episode"`, episodes are not held to common turns: see `_play_by_episode`), parses an
    action out of each reply, steps every environment at once through an `EnvPool`, and appends the observation as the
    chat template's token delta for a new message (never re-tokenising history): a user turn, or a tool message for
    environments whose `observation_role` is "tool" (the request for an action after an unreadable reply stays a user
    turn). It plays by the rules it is given whole (`EpisodeRules`). An episode stops when its environment says done,
    at `max_turns`, when the next observation would exceed `max_episode_tokens` (prompt included), or when one
    observation's message is longer than `max_observation_tokens` (its last turn's info's "truncation" says why):
    under no episode budget, one huge observation would otherwise go whole through every forward pass.

    An episode fails (it is dropped from the baseline and the loss, and its `failure` says why) when its environment
    raises, hangs past `env_timeout`, loses its worker or returns what breaks the contract (see
    `trl_multiturn.envs.base.checked_step_result`), and when its first observation leaves no room for a reply within
    `max_episode_tokens` or is longer than `max_observation_tokens`: cutting the observation would train on a task
    the environment never stated.

    A reply cut at `max_completion_length` has no sampled end-of-turn token. The documented choice here: the turn is
    closed with the template's end-of-turn token under mask 0 (the model is not trained to have emitted it) and the
    episode goes on.

    What a turn's context is and how an observation extends the episode are the episode format's
    (`rules.episode_format_strategy()`, `trl_multiturn.rollout.formats`): the trajectory format above, or the
    step-wise one, where each turn's context is rendered whole from the `history` policy's view of the episode.

    Args:
        environment_factory: callable returning a fresh `Environment`.
        tokenizer: the policy's tokenizer, with a prefix-preserving chat template.
        generate_fn: `(contexts, max_new_tokens) -> (completions, logprobs | None)`; one call per turn.
        rules: the `EpisodeRules` every episode is played by (turns, the reply, observation and episode caps, the
            system prompt, the action parser, the chat template's arguments, the episode format and history).
        The keywords say how the episodes are executed, never what is played:
        eos_token_ids: token ids that end a reply; defaults to the tokenizer's eos.
        env_mode / env_timeout / env_max_memory_mb / env_ray: see `EnvPool` (`mode`, `timeout`, `max_memory_mb`,
            `ray`).
        any_live: `(local live count) -> bool` that is True while any episode on any rank is live. Trainers pass a
            cross-rank reduction so that every rank makes the same number of generate calls.
        overlap: split the episodes into two halves that take turns, so that one half's environment steps run
            while the model generates for the other (`_play_overlapped`); each generate call then holds half the
            episodes. The episodes played are the same as without it (with a generate function that treats each
            context on its own, e.g. greedy decoding).
        schedule: "turn" (lockstep: each turn is one generate call for every live episode, and the next turn waits
            for the slowest environment step of this one) or "episode" (`_play_by_episode`: an episode whose step
            has returned goes back to generation at the next call, batched with every other episode ready by then,
            while the slower episodes' steps keep running). The episodes played are the same under both (with a
            generate function that treats each context on its own); only the calls' batches differ. Not with
            `overlap`, which is a two-group form of the same idea.
    """

    def __init__(
        self,
        environment_factory: EnvironmentFactory,
        tokenizer,
        generate_fn: GenerateFn,
        rules: EpisodeRules,
        *,
        eos_token_ids: Sequence[int] | None = None,
        env_mode: str = "auto",
        env_timeout: float | None = None,
        env_max_memory_mb: float | None = None,
        env_ray=None,
        any_live: Callable[[int], bool] | None = None,
        overlap: bool = False,
        schedule: str = "turn",
    ):
        if not isinstance(rules, EpisodeRules):
            raise TypeError(f"rules must be an EpisodeRules, got {type(rules).__name__}: build it with "
                            "EpisodeRules(max_turns=..., ...) or EpisodeRules.from_config(args)")
        self.tokenizer = tokenizer
        self.generate_fn = generate_fn
        self.rules = rules
        self.action_parser = get_action_parser(rules.action_parser, tokenizer)
        self.format = rules.episode_format_strategy()
        self.tokens = self.format.token_builder(tokenizer, eos_token_ids, rules.chat_template_kwargs)
        self.eos_token_ids = self.tokens.eos_token_ids
        self._check_episode_budget()
        self.observation_role = declared(environment_factory, "observation_role", "user")
        self.format.check_observation_role(self.tokens, self.observation_role)
        self.pool = EnvPool(environment_factory, mode=env_mode, timeout=env_timeout, max_memory_mb=env_max_memory_mb,
                            ray=env_ray)
        self.any_live = any_live or (lambda n: n > 0)
        check_schedule(schedule, overlap)
        self.overlap = overlap
        self.schedule = schedule
        self._warned_over_budget = False
        self.on_progress: Callable[[int, int, int], None] | None = None
        """Called as `on_progress(finished, episodes, turn)` after the resets and after each turn's observations of
        a call: how many of its episodes have ended, of how many, and the most turns any has played (0: the call
        has just reset its episodes). A progress bar (`trl_multiturn.progress.TurnProgress`) or None."""

    def _check_episode_budget(self) -> None:
        """Refuse a `max_episode_tokens` that no episode fits: the chat template around an empty first observation
        (and the system prompt) plus one reply token."""
        if self.rules.max_episode_tokens is None:
            return
        least = len(self.tokens.prompt_ids(self.opening_messages(""))) + 1
        if self.rules.max_episode_tokens < least:
            raise ValueError(
                f"max_episode_tokens={self.rules.max_episode_tokens} is smaller than any episode can be: the chat "
                f"template and system prompt alone take {least - 1} tokens before the first observation. Raise it to "
                f"cover the prompt, the observations and max_turns replies (or set it to None for no cap).")

    def opening_messages(self, observation: str) -> list[dict]:
        return opening_messages(observation, self.rules.system_prompt)

    def __call__(self, rows: list[dict]) -> list[Episode]:
        episodes = self._reset(rows)
        if self.schedule == "episode":
            self._play_by_episode(episodes)
        elif self.overlap and len(episodes) > 1:
            self._play_overlapped(episodes)
        else:
            for _ in range(self.rules.max_turns):
                live = [i for i, ep in enumerate(episodes) if self._is_live(ep)]
                if not self.any_live(len(live)):
                    break
                self._play_turn(episodes, live)
        self._finish_cut_episodes(episodes)
        return episodes

    def played_format(self, episodes: list[Episode]) -> EpisodeFormat:
        """The format `episodes` (this runner's) were played in, which their training rows follow: the rules' own
        (`AgentRunner.played_format` is the one that may differ)."""
        return self.format

    def close(self) -> None:
        self.pool.close()

    # -- one turn ----------------------------------------------------------------------------------------------------

    def _reset(self, rows: list[dict]) -> list[Episode]:
        episodes = []
        for row, first in zip(rows, self.pool.reset(list(rows))):
            if isinstance(first, EnvFailure):
                ep = Episode(task=row, prompt_ids=[], prompt_messages=[])
                ep.fail(first.reason)
            else:
                messages = self.opening_messages(first)
                ep = Episode(task=row, prompt_ids=self.tokens.prompt_ids(messages), prompt_messages=messages)
                self.format.start(ep)
                if self._budget(ep) < 1:
                    ep.fail(f"the first observation makes a prompt of {len(ep.prompt_ids)} tokens, leaving no room "
                            f"for a reply within max_episode_tokens={self.rules.max_episode_tokens}")
                elif reason := self.over_observation_cap(len(ep.prompt_ids) - self._empty_prompt_tokens):
                    ep.fail(f"the first observation: {reason}")
            episodes.append(ep)
        self._warn_if_most_over_budget(episodes)
        self._report_progress(episodes)
        return episodes

    def _report_progress(self, episodes: list[Episode]) -> None:
        if self.on_progress is not None:
            self.on_progress(sum(not self._is_live(ep) for ep in episodes), len(episodes),
                             max((ep.num_turns for ep in episodes), default=0))

    @functools.cached_property
    def _empty_prompt_tokens(self) -> int:
        return len(self.tokens.prompt_ids(self.opening_messages("")))

    def over_observation_cap(self, tokens: int) -> str | None:
        """Why an observation of `tokens` tokens ends its episode, or None when it fits `max_observation_tokens`."""
        cap = self.rules.max_observation_tokens
        if cap is None or tokens <= cap:
            return None
        return f"an observation of {tokens} tokens exceeds max_observation_tokens={cap}"

    def _warn_if_most_over_budget(self, episodes: list[Episode]) -> None:
        over = [len(ep.prompt_ids) for ep in episodes if ep.failed and ep.prompt_ids]  # reset failures have none
        if len(over) * 2 > len(episodes) and not self._warned_over_budget:
            self._warned_over_budget = True
            logger.warning(
                "%d of %d episodes failed before their first reply: their prompts (%d to %d tokens) leave no room "
                "within max_episode_tokens=%d. Raise max_episode_tokens.", len(over), len(episodes), min(over),
                max(over), self.rules.max_episode_tokens)

    def _budget(self, ep: Episode) -> int:
        """Tokens the episode may still sample in its next reply."""
        reply_cap, episode_cap = self.rules.max_completion_length, self.rules.max_episode_tokens
        if episode_cap is None:
            return reply_cap
        return int(min(reply_cap, episode_cap - self.format.context_length(ep)))

    def _play_turn(self, episodes: list[Episode], live: list[int]) -> None:
        to_step, actions = self._reply(episodes, live)
        self._observe(episodes, live, to_step, self.pool.step(to_step, actions))

    def _play_overlapped(self, episodes: list[Episode]) -> None:
        """Two sub-batches (the first and second half of the episodes) take turns: while one generates, the other's
        environment steps run in the pool. One generate call per iteration, on every rank while any rank has an
        episode that is live or waiting on its step (a rank with none makes the call with no context)."""
        half = (len(episodes) + 1) // 2
        groups = [range(half), range(half, len(episodes))]
        pending: list[tuple | None] = [None, None]  # per sub-batch: (live, to_step, PendingCalls) under way
        for call in itertools.count():
            g = call % 2
            if pending[g] is not None:
                self._observe(episodes, pending[g][0], pending[g][1], pending[g][2].results())
                pending[g] = None
            live = [i for i in groups[g] if self._is_live(episodes[i])]
            waiting = len(pending[1 - g][0]) if pending[1 - g] is not None else 0
            if not self.any_live(len(live) + waiting):
                break
            to_step, actions = self._reply(episodes, live)
            pending[g] = (live, to_step, self.pool.start_step(to_step, actions))
        for work in pending:  # the other sub-batch's last steps (none live anywhere, so none waiting here)
            if work is not None:
                self._observe(episodes, work[0], work[1], work[2].results())

    def _play_by_episode(self, episodes: list[Episode]) -> None:
        """Each generate call takes every live episode that is not waiting on its environment; an episode's step
        starts as soon as its reply is parsed and runs, with its own deadline, until it returns. When no episode is
        ready the loop waits for the first step to return (and takes every other one that has returned by then).

        One generate call per iteration, on every rank while any rank has an episode that is ready or stepping (a
        rank with none ready makes the call with no context, the trainers' dummy call), so ranks whose steps return
        in a different order still make equal numbers of calls."""
        ready = [i for i, ep in enumerate(episodes) if self._is_live(ep)]
        stepping: dict[int, PendingCalls] = {}  # episode -> its step under way
        while True:
            if not ready and stepping:
                ready = self._returned(episodes, stepping, wait=True)
            if not self.any_live(len(ready) + len(stepping)):
                break
            to_step, actions = self._reply(episodes, ready)
            for i, action in zip(to_step, actions):
                stepping[i] = self.pool.start_step([i], [action])
            unreadable = [i for i in ready if i not in stepping]
            self._observe(episodes, unreadable, [], [])
            ready = sorted([i for i in unreadable if self._is_live(episodes[i])]
                           + self._returned(episodes, stepping, wait=False))

    def _returned(self, episodes: list[Episode], stepping: dict[int, PendingCalls], wait: bool) -> list[int]:
        """Record the steps of `stepping` that have returned (with `wait`, after waiting for the first), take them
        off it, and return their episodes that are still live."""
        slots = list(stepping)
        calls = [stepping[i] for i in slots]
        done = self.pool.wait_any(calls) if wait else [k for k, call in enumerate(calls) if call.done()]
        returned = [slots[k] for k in done]
        for i in returned:
            self._observe(episodes, [i], [i], stepping.pop(i).results())
        return [i for i in returned if self._is_live(episodes[i])]

    def _is_live(self, ep: Episode) -> bool:
        return ep.live and ep.num_turns < self.rules.max_turns

    def _reply(self, episodes: list[Episode], live: list[int]) -> tuple[list[int], list[str]]:
        """One generate call for the `live` episodes; records each reply and returns the episodes whose reply holds
        an action, with their actions."""
        budgets = [self._budget(episodes[i]) for i in live]
        contexts = [self.format.context(episodes[i]) for i in live]
        completions, logprobs = self.generate_fn(contexts, max(budgets, default=self.rules.max_completion_length))
        to_step, actions = [], []
        for j, i in enumerate(live):
            ep = episodes[i]
            reply_ids = list(completions[j][: budgets[j]])
            reply_logps = list(logprobs[j][: budgets[j]]) if logprobs is not None else [math.nan] * len(reply_ids)
            start = len(ep.completion_ids)
            ep.completion_ids += reply_ids
            ep.env_mask += [1] * len(reply_ids)
            ep.logprobs += reply_logps
            reply = self.tokenizer.decode(reply_ids, skip_special_tokens=True)
            action = self.action_parser(reply)
            ep.turns.append(Turn(reply, action, (start, len(ep.completion_ids)),
                                 context=self.format.turn_context(contexts[j])))
            if action is not None:
                to_step.append(i)
                actions.append(action)
        return to_step, actions

    def _observe(self, episodes: list[Episode], live: list[int], to_step: list[int], step_results: list) -> None:
        """Record the environment's answer to each live episode's reply (a fixed note where it held no action)."""
        results = dict(zip(to_step, step_results))
        for i in live:
            if i in results:
                self._record(episodes[i], results[i], self.observation_role)
            else:
                self._record(episodes[i], StepResult(observation=UNREADABLE_REPLY), "user")
        self._report_progress(episodes)

    def _record(self, ep: Episode, result: StepResult | EnvFailure, role: str) -> None:
        if isinstance(result, EnvFailure):
            ep.fail(result.reason)
            return
        turn = ep.turns[-1]
        turn.reward, turn.observation, turn.role, turn.info = float(result.reward), result.observation, role, \
            result.info
        if result.done:
            ep.end(bool(result.won))
            return
        self.format.observe(self, ep, result.observation, role)

    def _finish_cut_episodes(self, episodes: list[Episode]) -> None:
        """Episodes still live after `max_turns`, or cut by the token budget, are truncated; an environment that
        can still score them does so in `finish()`."""
        cut = [i for i, ep in enumerate(episodes) if ep.truncated or ep.live]
        for i in cut:
            episodes[i].truncate()
        for i, result in zip(cut, self.pool.finish(cut)):
            ep = episodes[i]
            if isinstance(result, EnvFailure):
                ep.fail(result.reason)
            elif result is not None:
                if ep.turns:
                    ep.turns[-1].reward += float(result.reward)
                ep.score_truncated(bool(result.won))

