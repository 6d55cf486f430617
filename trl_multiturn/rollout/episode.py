"""The record of one played episode, in the token form the trainers consume."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(enum.Enum):
    """Where an episode stands; one value per combination that can happen.

    PLAYING: still live. WON / LOST: the environment ended it (`done`) with its verdict. TRUNCATED: the rollout cut it
    (`max_turns`, `max_episode_tokens`, `max_observation_tokens`) before the environment ended it, not won.
    TRUNCATED_WON: cut the same way, then scored a win by the environment's `finish()` (e.g. SWE-Gym grading the
    patch left when the turns ran out). FAILED: an infrastructure failure (the environment raised, hung, broke its
    contract, or the first observation left no room): left out of the baseline and the loss, never a reward.
    """

    PLAYING = "playing"
    WON = "won"
    LOST = "lost"
    TRUNCATED = "truncated"
    TRUNCATED_WON = "truncated_won"
    FAILED = "failed"


@dataclass
class Turn:
    """One turn: the model's reply and what answered it.

    `span = (start, end)` is the half-open range of the reply's sampled tokens in the episode's `completion_ids`.
    `action` is None when no action could be read from the reply: the environment was then not stepped, and
    `observation` is the runner's request for an action (what the model was shown), not a state of the environment.
    `observation` is None when the environment failed on this turn's step (the episode failed with it). `role` is the
    chat role the observation reached the model in: "user", or "tool" for the tool results of an environment whose
    `observation_role` is "tool" (the request for an action stays "user"). `context` (step-wise format only) is the
    whole context the reply was generated from.
    """

    reply: str
    action: str | None
    span: tuple[int, int]
    reward: float = 0.0
    observation: str | None = None
    role: str = "user"
    info: dict[str, Any] = field(default_factory=dict)
    context: list[int] | None = None


def _per_turn(attribute: str, doc: str, answered: bool = False) -> property:
    """A read-only list of one `Turn` attribute over the episode's turns (with `answered`, over the turns an
    observation answered: all but one the environment failed on)."""
    return property(lambda ep: [getattr(t, attribute) for t in ep.turns
                                if not answered or t.observation is not None], doc=doc)


@dataclass
class Episode:
    """One whole episode: the prompt, then the model's replies and the environment's observations interleaved.

    `completion_ids` holds every token after the prompt: each turn's sampled reply (end-of-turn token included)
    followed by the template tokens that carry the next observation. `env_mask[i]` is 1 exactly where
    `completion_ids[i]` was sampled by the model; `logprobs[i]` is its sampling log-probability (NaN elsewhere).
    `turns[k]` is turn k's record (`Turn`); `status` where the episode stands (`Status`), `failure` why it failed.
    The per-turn lists (`turn_rewards`, `actions`, ...) and the flags (`won`, `done`, `truncated`, `failed`) are
    read-only views of these: each list is made anew when read, so change a turn through `turns`, and the status
    through `fail`, `end`, `truncate` and `score_truncated`.

    Step-wise format: each turn's `context` is the whole context it was generated from (rendered from the History
    policy's view of the episode), `completion_ids` holds the replies only (`env_mask` all 1), and turn k's training
    sample is `step_contexts[k]` followed by `completion_ids[turn_spans[k][0]:turn_spans[k][1]]`. `next_context` is
    the context the next turn will be generated from while the episode is played (None once it ends).
    """

    task: dict
    prompt_ids: list[int]
    prompt_messages: list[dict]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    status: Status = Status.PLAYING
    failure: str | None = None
    next_context: list[int] | None = field(default=None, repr=False)

    # -- status ------------------------------------------------------------------------------------------------------

    def fail(self, reason: str) -> None:
        self.status, self.failure, self.next_context = Status.FAILED, reason, None

    def end(self, won: bool) -> None:
        """The environment ended the episode, won or not."""
        self.status, self.next_context = (Status.WON if won else Status.LOST), None

    def truncate(self) -> None:
        """The rollout cut the episode before the environment ended it."""
        self.status, self.next_context = Status.TRUNCATED, None

    def score_truncated(self, won: bool) -> None:
        """The environment's `finish()` verdict on a truncated episode."""
        if self.status not in (Status.TRUNCATED, Status.TRUNCATED_WON):
            raise ValueError(f"score_truncated on a {self.status.value} episode: only a truncated one is scored so")
        self.status = Status.TRUNCATED_WON if won else Status.TRUNCATED

    @property
    def won(self) -> bool:
        return self.status in (Status.WON, Status.TRUNCATED_WON)

    @property
    def done(self) -> bool:
        """Ended, by the environment or the rollout (a failed episode is not done: it is failed)."""
        return self.status in (Status.WON, Status.LOST, Status.TRUNCATED, Status.TRUNCATED_WON)

    @property
    def truncated(self) -> bool:
        return self.status in (Status.TRUNCATED, Status.TRUNCATED_WON)

    @property
    def failed(self) -> bool:
        return self.status is Status.FAILED

    @property
    def live(self) -> bool:
        return self.status is Status.PLAYING

    # -- per-turn views ----------------------------------------------------------------------------------------------

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    turn_spans = _per_turn("span", "Per turn: the (start, end) of its sampled reply in `completion_ids`.")
    turn_rewards = _per_turn("reward", "Per turn: the environment's reward.")
    replies = _per_turn("reply", "Per turn: the decoded reply.")
    actions = _per_turn("action", "Per turn: the action read from the reply (None: unreadable).")
    observations = _per_turn("observation", "Per answered turn: the observation that answered it.", answered=True)
    observation_roles = _per_turn("role", "Per answered turn: the observation's chat role.", answered=True)
    infos = _per_turn("info", "Per answered turn: the environment's info.", answered=True)

    @property
    def step_contexts(self) -> list[list[int]]:
        """Step-wise format: per turn, the context it was generated from; empty in the trajectory format."""
        return [t.context for t in self.turns if t.context is not None]

    @property
    def format_errors(self) -> list[bool]:
        """Per turn: True where the action parser could not read the reply."""
        return [t.action is None for t in self.turns]

    @property
    def turn_states(self) -> list[str]:
        """Per turn: the environment's state the turn started from, as its last real observation (the first
        observation, then each step's). A turn whose reply was unreadable did not step the environment, so the next
        turn starts from the same state as it did, whatever the model was shown in between."""
        state = self.prompt_messages[-1]["content"] if self.prompt_messages else ""
        states = []
        for turn in self.turns:
            states.append(state)
            if turn.observation is not None and turn.action is not None:
                state = turn.observation
        return states

    def messages(self) -> list[dict]:
        """The whole conversation as chat messages (for logs and reward functions), decoded replies included."""
        out = list(self.prompt_messages)
        for turn in self.turns:
            out.append({"role": "assistant", "content": turn.reply})
            if turn.observation is not None:
                out.append({"role": turn.role, "content": turn.observation})
        return out
