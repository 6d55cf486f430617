"""`SWEGymEnv`: fix a repository's issue with shell commands and file edits; the reward is SWE-bench's verdict."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...config_checks import Range, config_field
from ..base import Environment, StepResult, TaskError
from .actions import (
    COMMAND_REFERENCE,
    ActionParseError,
    Bash,
    Create,
    Replace,
    Submit,
    View,
    format_action,
    parse_action,
)
from .grading import DEFAULT_TEST_CMD, REWARD_MODES, as_test_list, grade_patch
from .patches import patch_to_actions
from .sandbox import DiffError, Sandbox, SandboxConfig, SandboxPathError, make_sandbox, truncate_middle

# `patch`, the gold patch: grading compares the test run's values with its run's (grading.py)
REQUIRED_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch", "FAIL_TO_PASS",
                   "PASS_TO_PASS", "patch")


@dataclass
class SWEGymConfig(SandboxConfig):
    """SWE-Gym episode settings; the sandbox settings it inherits (`SandboxConfig`) say where and how commands run.

    Parameters:
        > Parameters that control the episode

        submit_after_turns (`int`, *optional*):
            Turns after which the environment itself submits the current diff (None: the trainer's max_turns).
        max_observation_chars (`int`, defaults to `4000`):
            Longest observation, in characters (longer output keeps its head and tail).
        view_max_lines (`int`, defaults to `200`):
            Lines a <view> without a range shows.

        > Parameters that control the grading

        reward (`str`, defaults to `"resolved"`):
            'resolved' (1.0 when SWE-bench's grading resolves the task) or 'dense' (the share of FAIL_TO_PASS
            tests that pass).
        test_cmd (`str`, defaults to `"python -m pytest -rA -p no:cacheprovider"`):
            Test command for grading (a row's own `test_cmd` column wins).
        eval_timeout (`float`, defaults to `300.0`):
            Wall-clock seconds the grading test run may take.
    """

    # Parameters that control the episode
    submit_after_turns: int | None = config_field(
        None, "Turns after which the environment itself submits the current diff. None (for training) leaves the "
              "cut to the trainer's max_turns: the trainer calls finish() on an episode it stops, which grades the "
              "current diff the same way.", range=Range(ge=1))
    max_observation_chars: int = config_field(
        4000, "Longest observation, in characters; longer output keeps its head and tail around a '[... N "
              "characters truncated ...]' marker.", range=Range(ge=200))
    view_max_lines: int = config_field(200, "Lines a <view> without a range shows.", range=Range(ge=1))

    # Parameters that control the grading
    reward: str = field(
        default="resolved",
        metadata={"help": "'resolved': 1.0 when SWE-bench's grading resolves the task, else 0. 'dense': the share "
                  "of FAIL_TO_PASS tests that pass while every PASS_TO_PASS test still passes."},
    )
    test_cmd: str = field(
        default=DEFAULT_TEST_CMD,
        metadata={"help": "Test command for grading (the test files are appended); a row's own `test_cmd` "
                  "column wins."},
    )
    eval_timeout: float = config_field(300.0, "Wall-clock seconds the grading test run may take.", range=Range(gt=0))

    def __post_init__(self):
        super().__post_init__()  # checks every field's type and range, the sandbox's and these
        if self.reward not in REWARD_MODES:
            raise ValueError(f"reward={self.reward!r}: choose one of {REWARD_MODES}")


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{n:>5}  {line}" for n, line in enumerate(lines, start=first))


class SWEGymEnv(Environment):
    """A coding episode on one SWE-bench / SWE-Gym task row.

    `reset(row)` checks the repository out in a fresh sandbox and returns the issue and the command reference;
    each `step(reply)` runs the first action of the reply (see `actions.py`) and returns its output. The episode
    ends when the agent submits, after `submit_after_turns` turns, or when the trainer cuts it and calls `finish()`:
    each grades the current diff in a clean copy (`grading.grade_patch`) and returns the reward on that final
    step (`info` holds the patch and the test counts). A reply without a valid action costs a turn and gets an
    error observation. Sandbox failures (e.g. a container that cannot start) raise `SandboxError`: an
    infrastructure failure, not a lost episode.

    Use `functools.partial(SWEGymEnv, SWEGymConfig(...))` (or keyword overrides) as the environment factory.
    `episode_root_extra`: host paths added to the root of the episode's own sandbox only (an agent's programs, as
    `agents.codex_cli` adds node and Codex); the grading sandboxes are built from `config` alone.
    """

    execution = "thread"  # its steps wait on sandbox subprocesses: threads overlap them without a process each
    # Every sandbox call is bounded by itself (command_timeout, eval_timeout, non-blocking file operations); this is
    # the backstop for a call that still hangs (the repository's setup, a wedged container), when env_timeout is None.
    call_timeout = 3600.0

    def __init__(self, config: SWEGymConfig | None = None, *, episode_root_extra: Sequence[str] = (), **overrides):
        config = config or SWEGymConfig()
        self.config = dataclasses.replace(config, **overrides) if overrides else config
        self.episode_config = (dataclasses.replace(self.config, root_extra=[*self.config.root_extra,
                                                                             *episode_root_extra])
                               if episode_root_extra else self.config)
        self.sandbox: Sandbox | None = None
        self.task: dict | None = None
        self.turns = 0
        self.done = False

    # -- episode -------------------------------------------------------------------------------------------------

    def reset(self, task: dict) -> str:
        missing = [name for name in REQUIRED_FIELDS if name not in task or task[name] is None]
        if missing:
            raise TaskError(
                f"task row lacks {missing}: SWEGymEnv needs the SWE-bench columns {list(REQUIRED_FIELDS)}; use rows "
                "from trl_multiturn.envs.swegym.load_tasks() or the SWE-Gym dataset"
            )
        for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            try:
                as_test_list(task[name], name)
            except ValueError as e:
                raise TaskError(f"task row {task['instance_id']}: {e}") from e
        self.close()
        self.sandbox = make_sandbox(self.episode_config)
        self.sandbox.start(task)
        self.task, self.turns, self.done = task, 0, False
        return self.first_observation(task)

    def first_observation(self, task: dict) -> str:
        test_cmd = task.get("test_cmd") or self.config.test_cmd
        return (
            f"You are in the repository {task['repo']} (your current folder). Resolve the issue below by editing "
            f"its code; the tests that check the fix are not in the repository, and changes to test files, pytest "
            f"configuration and conftest.py files are not graded. The project's tests run with: "
            f"{test_cmd}\n\n<issue>\n{task['problem_statement'].strip()}\n</issue>\n\n{COMMAND_REFERENCE}"
        )

    def step(self, action: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("call reset(task) before step()")
        if self.done:
            raise RuntimeError("the episode is over: call reset(task) to start another")
        self.turns += 1
        try:
            parsed = parse_action(action)
        except ActionParseError as e:
            result = StepResult(f"[error] {e}\nUse one of the formats of the command reference.",
                                info={"action": "invalid", "error": str(e)})
        else:
            if isinstance(parsed, Submit):
                return self._submit("agent")
            result = self._execute(parsed)
        if self.config.submit_after_turns is not None and self.turns >= self.config.submit_after_turns:
            final = self._submit("turn_limit")
            final.observation = f"{result.observation}\n\n{final.observation}"
            final.info = {**result.info, **final.info}
            return final
        return result

    def finish(self) -> StepResult | None:
        """Grade the current diff of an episode the trainer cut short; None when no episode is live."""
        if self.task is None or self.done:
            return None
        return self._submit("truncated")

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def expert_actions(self, task: dict) -> list[str] | None:
        """Replies that solve `task` with its gold patch: view each changed region, replace each hunk, submit."""
        patch = task.get("patch")
        if not patch:
            return None
        try:
            actions = patch_to_actions(patch)
        except ValueError:
            return None
        return [format_action(a) for a in [*actions, Submit()]]

    # -- actions -------------------------------------------------------------------------------------------------

    def _fit(self, text: str) -> tuple[str, bool]:
        budget = self.config.max_observation_chars
        return truncate_middle(text, budget), len(text) > budget

    def _execute(self, action) -> StepResult:
        kind = type(action).__name__.lower()
        try:
            if isinstance(action, Bash):
                return self._bash(action)
            if isinstance(action, View):
                return self._view(action)
            if isinstance(action, Replace):
                return self._replace(action)
            return self._create(action)
        except SandboxPathError as e:
            return StepResult(f"[error] {e}", info={"action": kind, "error": str(e)})

    def _bash(self, action: Bash) -> StepResult:
        result = self.sandbox.run(action.command)
        output, truncated = self._fit(result.output if result.output else "(no output)\n")
        if result.timed_out:
            footer = f"[killed: the command ran past the {self.config.command_timeout:g} s wall-clock limit]"
        else:
            footer = f"[exit code: {result.exit_code}]"
        return StepResult(
            f"{output.rstrip(chr(10))}\n{footer}",
            info={"action": "bash", "exit_code": result.exit_code, "timed_out": result.timed_out,
                  "truncated": truncated},
        )

    def _view(self, action: View) -> StepResult:
        try:
            text = self.sandbox.read_file(action.path)
        except SandboxPathError:
            listing = self.sandbox.run(f"cd -- {shlex.quote(action.path)} 2>/dev/null && ls -A1p")
            if listing.exit_code != 0:
                raise
            body, truncated = self._fit(listing.output or "(empty folder)\n")
            return StepResult(f"{action.path}/ holds:\n{body}", info={"action": "view", "truncated": truncated})
        lines = text.splitlines()
        first = max(1, action.start or 1)
        last = min(len(lines), action.end or first + self.config.view_max_lines - 1)
        if lines and first > len(lines):
            raise SandboxPathError(f"{action.path} has {len(lines)} lines; start at or before line {len(lines)}")
        header = f"{action.path} (lines {first}-{last} of {len(lines)})" if lines else f"{action.path} (empty file)"
        body, truncated = self._fit(_numbered(lines[first - 1 : last], first))
        more = f"\n[{len(lines) - last} more lines: view them with lines=\"{last + 1}-\"]" if last < len(lines) else ""
        return StepResult(f"{header}\n{body}{more}", info={"action": "view", "truncated": truncated})

    def _replace(self, action: Replace) -> StepResult:
        text = self.sandbox.read_file(action.path)
        count = text.count(action.old)
        if count != 1:
            hint = ("check the exact text, spaces and indentation included, with <view>" if count == 0
                    else "include more surrounding lines so that it is unique")
            message = f"the old text occurs {count} times in {action.path}; {hint}"
            return StepResult(f"[error] {message}", info={"action": "replace", "error": message})
        at = text.index(action.old)
        new_text = text[:at] + action.new + text[at + len(action.old):]
        self.sandbox.write_file(action.path, new_text)
        first = text.count("\n", 0, at) + 1
        new_lines = (text[:at] + action.new).count("\n") + 1
        lines = new_text.splitlines()
        lo, hi = max(1, first - 2), min(len(lines), new_lines + 2)
        snippet, _ = self._fit(_numbered(lines[lo - 1 : hi], lo))
        return StepResult(f"Edited {action.path}; lines {lo}-{hi} now read:\n{snippet}", info={"action": "replace"})

    def _create(self, action: Create) -> StepResult:
        try:
            self.sandbox.read_file(action.path)
            verb = "Overwrote"
        except SandboxPathError:
            verb = "Created"
        self.sandbox.write_file(action.path, action.content)
        return StepResult(f"{verb} {action.path} ({len(action.content.splitlines())} lines).",
                          info={"action": "create"})

    # -- the end -------------------------------------------------------------------------------------------------

    def _submit(self, by: str) -> StepResult:
        try:
            patch, diff_error = self.sandbox.diff(self.task["base_commit"]), None
        except DiffError as e:
            patch, diff_error = "", str(e)
        self.close()  # the agent's checkout is no longer needed; grading uses a clean copy
        self.done = True
        grade = grade_patch(self.task, patch, self.config, test_cmd=self.config.test_cmd,
                            eval_timeout=self.config.eval_timeout)
        reward = grade.reward(self.config.reward)
        reason = {"agent": "Submitted", "turn_limit": "Turn limit reached: submitted the current diff",
                  "truncated": "Episode cut: submitted the current diff"}[by]
        info = {"action": "submit", "submitted_by": by, "patch": patch, **grade.info()}
        summary = grade.summary()
        if diff_error:
            info["diff_error"] = diff_error
            summary = f"Your changes could not be taken: {diff_error}."
        return StepResult(f"{reason}. {summary}", reward=reward, done=True, won=grade.resolved, info=info)
