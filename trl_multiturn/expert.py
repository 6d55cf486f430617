"""Expert trajectories for multi-turn SFT, in exactly the token form of the RL rollouts.

`expert_trajectories(env, tasks)` replays each task's expert solution (`Environment.expert_actions`) through the
environment, keeps only episodes the environment reports as won, and returns one conversation per task: the
rollout's opening messages (optional system prompt, first observation), then each expert action as an assistant
turn and each observation as the next user turn.

`conversation_token_ids` turns such a conversation into `input_ids` and `assistant_masks` the way
`EpisodeRunner` builds an episode: the prompt is rendered once, then every turn appends the template's
tokens for the reply's content (end-of-turn token included, mask 1) and the template's delta for the next
observation (mask 0). An SFT example is therefore token for token the episode the RL trainers would build if the
model sampled the expert's replies, and its assistant mask is the rollout's `env_mask`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence

import datasets

from .envs.base import Environment
from .rollout.chat_tokens import ChatTokenBuilder
from .rollout.parsing import ActionParser, get_action_parser
from .rollout.runner import opening_messages

logger = logging.getLogger(__name__)


class ExpertTrajectoryError(RuntimeError):
    """A task's expert solution is missing, does not win, or cannot be replayed through a rollout unchanged."""


def split_conversation(messages: Sequence[dict]) -> tuple[list[dict], list[str], list[str]]:
    """`(opening, replies, observations)` of an episode conversation.

    The conversation must be: opening messages (any system messages, then the first user message), then assistant
    and observation messages (user, or tool for tool results) alternating, ending on an assistant message.
    `observations[k]` follows `replies[k]`, so there is one observation fewer than replies.
    """
    roles = [m.get("role") for m in messages]
    if "assistant" not in roles:
        raise ValueError("the conversation has no assistant message: an SFT episode needs at least one reply")
    first = roles.index("assistant")
    if first == 0 or roles[first - 1] != "user":
        raise ValueError(f"message {first} is the first assistant reply but no user message (the first observation) "
                         "comes before it; start the conversation with [system,] user, assistant, ...")
    turns = list(messages[first:])
    for k, message in enumerate(turns):
        expected = ("assistant",) if k % 2 == 0 else ("user", "tool")
        if message.get("role") not in expected:
            also = " (or 'tool', for a tool result)" if k % 2 else ""
            raise ValueError(f"message {first + k} has role {message.get('role')!r} where {expected[0]!r} is "
                             f"expected{also}: after the opening, assistant replies and observations must alternate")
    if turns[-1]["role"] != "assistant":
        raise ValueError(f"the conversation ends with a {turns[-1]['role']!r} message: end it on the assistant's "
                         "last reply (an observation after the last reply is never trained on)")
    replies = [m["content"] for m in turns[0::2]]
    observations = [m["content"] for m in turns[1::2]]
    return list(messages[:first]), replies, observations


def conversation_token_ids(builder: ChatTokenBuilder, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """`(input_ids, assistant_masks)` of an episode conversation, built turn by turn as the episode runner does:

        input_ids = prompt_ids(opening) + reply_0 + obs_1 + reply_1 + ... + reply_K
        mask      =       0 ...          1 ...    0 ...    1 ...          1 ...

    where `reply_k = builder.assistant_content_ids(content_k)` (end-of-turn token included) and
    `obs_k = builder.observation_ids(observation_k, role_k)` (template delta for the next user or tool message).
    """
    opening, replies, observations = split_conversation(messages)
    roles = [m["role"] for m in messages[len(opening):]][1::2]
    input_ids = builder.prompt_ids(opening)
    mask = [0] * len(input_ids)
    for k, reply in enumerate(replies):
        reply_ids = builder.assistant_content_ids(reply)
        input_ids += reply_ids
        mask += [1] * len(reply_ids)
        if k < len(observations):
            obs_ids = builder.observation_ids(observations[k], roles[k])
            input_ids += obs_ids
            mask += [0] * len(obs_ids)
    return input_ids, mask


def _as_environment(env) -> tuple[Environment, bool]:
    """An environment instance and whether it was made here (and must be closed here)."""
    if hasattr(env, "reset") and hasattr(env, "step") and not isinstance(env, type):
        return env, False
    if callable(env):
        return env(), True
    raise TypeError(f"`env` must be an Environment or a callable returning one, got {type(env).__name__}")


def _replay(env: Environment, task: dict, parser: ActionParser, system_prompt: str | None,
            builder: ChatTokenBuilder | None) -> list[dict]:
    """The won conversation of `task`'s expert solution; raises ExpertTrajectoryError otherwise."""
    actions = env.expert_actions(task)
    if not actions:
        raise ExpertTrajectoryError(f"{type(env).__name__} has no expert solution for task {task!r} "
                                    "(`expert_actions` returned nothing)")
    messages = opening_messages(env.reset(task), system_prompt)
    for k, action in enumerate(actions):
        if parser(action) != action:
            raise ExpertTrajectoryError(
                f"expert action {k} {action!r} of task {task!r} reads back as {parser(action)!r} through the action "
                "parser, so an RL rollout would play another action than the one taught: use an action parser that "
                "returns the reply unchanged (e.g. action_parser='whole_reply')"
            )
        if builder is not None:
            # What the runner does with sampled reply ids: decode them, special tokens skipped.
            decoded = builder.tokenizer.decode(builder.assistant_content_ids(action), skip_special_tokens=True)
            if decoded != action:
                raise ExpertTrajectoryError(
                    f"expert action {k} {action!r} of task {task!r} decodes back as {decoded!r} after tokenization, "
                    "so an RL rollout would play another action than the one taught"
                )
        result = env.step(action)
        messages.append({"role": "assistant", "content": action})
        if result.done:
            if not result.won:
                raise ExpertTrajectoryError(f"the expert solution of task {task!r} ends the game at action {k} "
                                            f"({action!r}) without winning it")
            return messages
        messages.append({"role": "user", "content": result.observation})
    raise ExpertTrajectoryError(f"the expert solution of task {task!r} ({len(actions)} actions) does not finish "
                                "the game")


def expert_trajectories(
    env,
    tasks: Iterable[dict],
    tokenizer=None,
    *,
    system_prompt: str | None = None,
    action_parser: str | ActionParser = "first_line",
    eos_token_ids: Sequence[int] | None = None,
    chat_template_kwargs: dict | None = None,
    skip_failures: bool = False,
) -> datasets.Dataset:
    """An SFT dataset: one won expert episode per task.

    Args:
        env: an `Environment` with `expert_actions` (e.g. `TextWorldEnv()`), or a callable returning one.
        tasks: task rows (a list of dicts or a `datasets.Dataset`), as the RL trainers take them.
        tokenizer: when given, each row also gets `input_ids` and `assistant_masks` from `conversation_token_ids`;
            without it the rows hold `messages` only and `MultiTurnSFTTrainer` tokenizes them with its own
            tokenizer.
        system_prompt / action_parser / eos_token_ids / chat_template_kwargs: the same values the RL trainer uses
            (its config's `system_prompt`, `action_parser`, `chat_template_kwargs`; the trainer's eos ids).
        skip_failures: leave out (and log) tasks whose expert solution does not win instead of raising.

    Each row holds `messages` (the episode conversation), `num_turns`, `task` (the task row) and, with a tokenizer,
    `input_ids` and `assistant_masks` (1 exactly on the tokens of every assistant reply, its end-of-turn token
    included).

    The replay runs the environment on a thread of its own, as the "thread" env mode does: an environment that
    installs signal handlers (e.g. a SIGALRM timeout) cannot be replayed here.
    """
    parser = get_action_parser(action_parser, tokenizer)
    builder = ChatTokenBuilder(tokenizer, eos_token_ids, chat_template_kwargs) if tokenizer is not None else None
    # On a thread of its own: an engine may keep exceptions whose tracebacks reach every calling frame (TextWorld's
    # parser memoises its failed parses; ALFWorld's games did the same), which kept the caller's objects alive, e.g.
    # the SFT trainer being built, its model and optimizer, through the GRPO stage after it. A new thread's frames
    # reach no caller's.
    outcome, stop = {}, threading.Event()

    def replay():
        try:
            outcome["rows"] = _won_episodes(env, tasks, parser, system_prompt, builder, skip_failures, stop)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=replay, name="expert-replay")
    try:
        thread.start()
        thread.join()
    finally:
        stop.set()  # e.g. after a Ctrl-C: the replay ends after its current task (its environment closed)
        if thread.is_alive():
            thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return datasets.Dataset.from_list(outcome["rows"])


def _won_episodes(env, tasks, parser: ActionParser, system_prompt: str | None, builder: ChatTokenBuilder | None,
                  skip_failures: bool, stop: threading.Event) -> list[dict]:
    """`expert_trajectories`' rows; an empty list once `stop` is set."""
    environment, owned = _as_environment(env)
    rows, skipped = [], []
    try:
        for task in tasks:
            if stop.is_set():
                return []
            task = dict(task)
            try:
                messages = _replay(environment, task, parser, system_prompt, builder)
            except ExpertTrajectoryError as exc:
                if not skip_failures:
                    raise
                skipped.append(str(exc))
                continue
            row = {"messages": messages, "num_turns": sum(m["role"] == "assistant" for m in messages), "task": task}
            if builder is not None:
                row["input_ids"], row["assistant_masks"] = conversation_token_ids(builder, messages)
            rows.append(row)
    finally:
        if owned:
            environment.close()
    if skipped:
        logger.warning("skipped %d task(s) whose expert solution failed; first: %s", len(skipped), skipped[0])
    if not rows:
        raise ExpertTrajectoryError("no task yielded a won expert episode" +
                                    (f" ({len(skipped)} failed; first: {skipped[0]})" if skipped else ""))
    return rows
