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

`dagger_episodes(env, tasks, generate, builder, beta=...)` plays DAgger's mixture policy (the expert with probability
`beta` at each turn, the student otherwise) and labels every state it reaches with the environment's expert action
(`Environment.expert_action`): one example per state, its context the episode's tokens so far (the student's sampled
ids as sampled), only the expert action's tokens trained. `dagger_beta` is the mixing schedule.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import datasets

from .envs.base import Environment, checked_step_result, has_expert_action
from .rollout.chat_tokens import ChatTokenBuilder
from .rollout.parsing import ActionParser, get_action_parser
from .rollout.runner import UNREADABLE_REPLY, opening_messages

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


def _taught_ids(action: str, parser: ActionParser, builder: ChatTokenBuilder | None, what: str) -> list[int] | None:
    """The reply tokens that teach `action` (None without a builder); raises ExpertTrajectoryError where a rollout
    would play another action than the one taught: the parser reads the reply differently, or the tokens decode to
    another text."""
    if parser(action) != action:
        raise ExpertTrajectoryError(
            f"{what} reads back as {parser(action)!r} through the action parser, so an RL rollout would play another "
            "action than the one taught: use an action parser that returns the reply unchanged (e.g. "
            "action_parser='whole_reply')"
        )
    if builder is None:
        return None
    ids = builder.assistant_content_ids(action)
    # What the runner does with sampled reply ids: decode them, special tokens skipped.
    decoded = builder.tokenizer.decode(ids, skip_special_tokens=True)
    if decoded != action:
        raise ExpertTrajectoryError(f"{what} decodes back as {decoded!r} after tokenization, so an RL rollout would "
                                    "play another action than the one taught")
    return ids


def _replay(env: Environment, task: dict, parser: ActionParser, system_prompt: str | None,
            builder: ChatTokenBuilder | None) -> list[dict]:
    """The won conversation of `task`'s expert solution; raises ExpertTrajectoryError otherwise."""
    actions = env.expert_actions(task)
    if not actions:
        raise ExpertTrajectoryError(f"{type(env).__name__} has no expert solution for task {task!r} "
                                    "(`expert_actions` returned nothing)")
    messages = opening_messages(env.reset(task), system_prompt)
    for k, action in enumerate(actions):
        _taught_ids(action, parser, builder, f"expert action {k} {action!r} of task {task!r}")
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
    rows = _on_own_thread(lambda stop: _won_episodes(env, tasks, parser, system_prompt, builder, skip_failures, stop),
                          "expert-replay")
    return datasets.Dataset.from_list(rows)


def _on_own_thread(play: Callable[[threading.Event], Any], name: str) -> Any:
    """`play(stop)` run on a thread of its own; `stop` is set when the caller stops waiting (e.g. after a Ctrl-C), and
    `play` should then end after its current task.

    An engine may keep exceptions whose tracebacks reach every calling frame (TextWorld's parser memoises its failed
    parses; ALFWorld's games did the same), which kept the caller's objects alive, e.g. the SFT trainer being built,
    its model and optimizer, through the GRPO stage after it. A new thread's frames reach no caller's.
    """
    outcome, stop = {}, threading.Event()

    def run():
        try:
            outcome["rows"] = play(stop)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=name)
    try:
        thread.start()
        thread.join()
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["rows"]


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


def dagger_beta(iteration: int, beta_0: float, decay: float) -> float:
    """DAgger's mixing weight (Ross, Gordon & Bagnell, 2011): the probability that the expert, not the student, acts
    at a turn of iteration `i` (counted from 0),

        beta_i = beta_0 * decay ** i

    `beta_0 = 1` makes the first iteration behaviour cloning on the expert's own states; `decay = 0` lets the student
    act alone from the second iteration on (the paper's `beta_i = I(i = 1)`).
    """
    if iteration < 0:
        raise ValueError(f"iteration={iteration}: DAgger's iterations count from 0")
    if not (0.0 <= beta_0 <= 1.0 and 0.0 <= decay <= 1.0):
        raise ValueError(f"beta_0={beta_0}, decay={decay}: both must lie in [0, 1] (beta_i is a probability)")
    return beta_0 * decay ** iteration


def require_expert_action(env: Environment) -> None:
    """Raise a one-line ValueError if `env` cannot name the expert's action for its current state."""
    if not has_expert_action(env):
        name = type(env).__name__
        raise ValueError(f"{name} has no per-state expert, so DAgger cannot label the states the student reaches: "
                         f"implement `{name}.expert_action()` (the expert's action for the current state)")


def dagger_episodes(
    env,
    tasks: Iterable[dict],
    generate: Callable,
    builder: ChatTokenBuilder,
    *,
    beta: float,
    rng: random.Random,
    max_turns: int,
    max_completion_length: int,
    system_prompt: str | None = None,
    action_parser: str | ActionParser = "first_line",
) -> tuple[list[dict], dict]:
    """One DAgger collection: an episode per task under the mixture policy, every state it reaches labelled.

    At each turn the environment's expert names its action for the current state (`env.expert_action()`); the
    expert then acts with probability `beta` (drawn from `rng`), the student (`generate`, a `GenerateFn` as the
    runner takes: `generate(contexts, max_new_tokens) -> (completions, logprobs)`) otherwise. The episode's tokens
    grow as the runner's trajectory format grows them: the reply's ids as sampled (closed with the end-of-turn token
    where the per-turn cap cut it), then the template's delta for the observation. An episode ends when the
    environment says done, after `max_turns` replies, or where the expert has no action.

    Returns `(rows, stats)`. One row per labelled state: `input_ids` = the episode's tokens up to the state + the
    expert action's reply tokens (`builder.assistant_content_ids`), `assistant_masks` 1 exactly on the latter;
    `messages` (the conversation up to the state, then the expert's action as the assistant's reply), `task`,
    `episode` (index in `tasks`), `turn`, `actor` ("expert" or "student": who then acted) and `played` (the action
    played, None for a reply the parser found no action in). `stats`: `episodes`, `won` (episodes won), `turns`,
    `student_turns`, `student_agreed` (student turns whose action was the expert's).
    """
    require_expert_action(env)
    parser = get_action_parser(action_parser, builder.tokenizer)

    def play(stop: threading.Event) -> tuple[list[dict], dict]:
        rows, stats = [], dict.fromkeys(("episodes", "won", "turns", "student_turns", "student_agreed"), 0)
        for index, task in enumerate(tasks):
            if stop.is_set():
                break
            _dagger_episode(env, dict(task), index, generate, builder, parser, beta, rng, max_turns,
                            max_completion_length, system_prompt, rows, stats)
        return rows, stats

    return _on_own_thread(play, "dagger-episodes")


def _dagger_episode(env: Environment, task: dict, index: int, generate: Callable, builder: ChatTokenBuilder,
                    parser: ActionParser, beta: float, rng: random.Random, max_turns: int, max_new_tokens: int,
                    system_prompt: str | None, rows: list[dict], stats: dict) -> None:
    """Play one episode of `dagger_episodes`, appending its rows to `rows` and counting it in `stats`."""
    messages = opening_messages(env.reset(task), system_prompt)
    context = builder.prompt_ids(messages)
    stats["episodes"] += 1
    for turn in range(max_turns):
        label = env.expert_action()
        if label is None:
            break
        label_ids = _taught_ids(label, parser, builder, f"expert action {label!r} at turn {turn} of task {task!r}")
        actor = "expert" if rng.random() < beta else "student"
        if actor == "expert":
            reply_ids, reply, action = label_ids, label, label
        else:
            completions, _ = generate([context], max_new_tokens)
            reply_ids = list(completions[0][:max_new_tokens])
            reply = builder.tokenizer.decode(reply_ids, skip_special_tokens=True)
            action = parser(reply)
            stats["student_turns"] += 1
            stats["student_agreed"] += action == label
        stats["turns"] += 1
        rows.append({"input_ids": context + label_ids, "assistant_masks": [0] * len(context) + [1] * len(label_ids),
                     "messages": [*messages, {"role": "assistant", "content": label}], "task": task, "episode": index,
                     "turn": turn, "actor": actor, "played": action})
        messages.append({"role": "assistant", "content": reply})
        context = context + reply_ids + builder.close_ids(reply_ids)
        if action is None:
            observation, role = UNREADABLE_REPLY, "user"
        else:
            result = checked_step_result(env.step(action))
            if result.done:
                stats["won"] += result.won
                return
            observation, role = result.observation, env.observation_role
        messages.append({"role": role, "content": observation})
        context = context + builder.observation_ids(observation, role)
