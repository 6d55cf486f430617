"""The record of one played episode, in the token form the trainers consume."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Episode:
    """One whole episode: the prompt, then the model's replies and the environment's observations interleaved.

    `completion_ids` holds every token after the prompt: each turn's sampled reply (end-of-turn token included)
    followed by the template tokens that carry the next observation. `env_mask[i]` is 1 exactly where
    `completion_ids[i]` was sampled by the model. `turn_spans[k] = (start, end)` is the half-open range of turn k's
    sampled tokens in `completion_ids`; `turn_rewards[k]` is the environment's reward for turn k. `actions[k]` is
    None when no action could be read from reply k: the environment was then not stepped, and `observations[k]` is
    the runner's request for an action (what the model was shown), not a state of the environment.
    `observation_roles[k]` is the chat role `observations[k]` reached the model in: "user", or "tool" for the tool
    results of an environment whose `observation_role` is "tool" (the request for an action stays "user").

    Step-wise format: `step_contexts[k]` is the whole context turn k was generated from (rendered from the History
    policy's view of the episode), `completion_ids` holds the replies only (`env_mask` all 1), and turn k's training
    sample is `step_contexts[k]` followed by `completion_ids[turn_spans[k][0]:turn_spans[k][1]]`. Empty in the
    trajectory format.
    """

    task: dict
    prompt_ids: list[int]
    prompt_messages: list[dict]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    actions: list[str | None] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    won: bool = False
    done: bool = False
    truncated: bool = False
    failed: bool = False
    failure: str | None = None
    infos: list[dict[str, Any]] = field(default_factory=list)
    observation_roles: list[str] = field(default_factory=list)
    step_contexts: list[list[int]] = field(default_factory=list)

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def format_errors(self) -> list[bool]:
        """Per turn: True where the action parser could not read the reply."""
        return [a is None for a in self.actions]

    @property
    def turn_states(self) -> list[str]:
        """Per turn: the environment's state the turn started from, as its last real observation (the first
        observation, then each step's). A turn whose reply was unreadable did not step the environment, so the next
        turn starts from the same state as it did, whatever the model was shown in between."""
        state = self.prompt_messages[-1]["content"] if self.prompt_messages else ""
        states = []
        for k in range(self.num_turns):
            states.append(state)
            if k < len(self.observations) and self.actions[k] is not None:
                state = self.observations[k]
        return states

    def messages(self) -> list[dict]:
        """The whole conversation as chat messages (for logs and reward functions), decoded replies included."""
        out = list(self.prompt_messages)
        for k, reply in enumerate(self.replies):
            out.append({"role": "assistant", "content": reply})
            if k < len(self.observations):
                role = self.observation_roles[k] if k < len(self.observation_roles) else "user"
                out.append({"role": role, "content": self.observations[k]})
        return out
