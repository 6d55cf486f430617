"""Agents in their own processes: `AgentCommand(argv)` as an `AgentEnvironment`'s agent runs a program per episode.

Each episode starts the command in a session of its own (its own process group), stdin closed, with the endpoint in
its environment under the names the usual clients read:

    OPENAI_BASE_URL, OPENAI_API_BASE   http://127.0.0.1:PORT/v1     (openai, litellm, Codex, opencode, ...)
    OPENAI_API_KEY                     the episode's key
    ANTHROPIC_BASE_URL                 http://127.0.0.1:PORT        (anthropic, Claude Code: they append /v1/...)
    ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN   the episode's key
    TRL_MULTITURN_MODEL                the model name to send
    TRL_MULTITURN_TASK                 a JSON file holding the task row
    TRL_MULTITURN_RESULT               a file the command may write its reward to (see `AgentCommand.score`)

plus the command's own `env`. The process, and every process it started in its group, is killed (SIGKILL to the
group) when its episode fails (past `agent_timeout`, a malformed request, the rollout stopping) and when it exits
(what it left running in the background). Its output (stdout and stderr together) is kept bounded: the first and
last `output_limit / 2` bytes. A non-zero exit status fails the episode (the harness crashed: an infrastructure
failure, never a reward), its output's tail in the failure. Requests the process, or what it left behind, makes
after its episode ended are refused (410) and change nothing (`AgentRunner`). Where util-linux's `setpriv` is
installed (Debian and most Linux distributions), the command is started through `setpriv --pdeathsig=KILL`: if the
trainer itself is killed (SIGKILL, which runs no clean-up), the kernel kills the command with it. What the command
started in the background is not reached that way (it is killed at the episode's end, with the group).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union

from .runner import AgentResult, AgentSession

POLL_SECONDS = 0.1  # how often a running command's episode is checked for having failed
DIE_WITH_TRAINER = ("setpriv", "--pdeathsig=KILL", "--") if shutil.which("setpriv") else ()
"""The prefix that has the kernel kill a command when the thread that started it dies (the module docstring)."""


@dataclass(frozen=True)
class CommandRun:
    """How one episode's command ended: its exit status, its bounded output, the JSON it wrote to
    $TRL_MULTITURN_RESULT (None when it wrote none), its wall time, and whether it was killed (its episode failed)."""

    returncode: int
    output: str
    result: object
    seconds: float
    killed: bool


Score = Callable[[dict, CommandRun], Union[float, AgentResult]]


@dataclass
class AgentCommand:
    """A command line played once per episode (see the module docstring); pass it as `AgentEnvironment(agent=...)`.

    argv: the command, or `argv(task_row) -> list[str]` for a command that takes the task in its arguments.
    env: variables added to the command's environment (over the trainer's own and the endpoint's), or
        `env(task_row, session) -> dict`.
    cwd: the folder it starts in (None: a fresh empty folder of the episode's, removed at its end).
    score: `score(task_row, run: CommandRun) -> reward | AgentResult`; None reads what the command wrote to
        $TRL_MULTITURN_RESULT: a number (the reward) or `{"reward": ..., "won": ..., "turn_rewards": [...]}`.
    output_limit: bytes of output kept (the first and last half).
    """

    argv: Union[Sequence[str], Callable[[dict], Sequence[str]]]
    env: Union[Mapping[str, str], Callable[[dict, AgentSession], Mapping[str, str]], None] = None
    cwd: str | None = None
    score: Score | None = None
    output_limit: int = 64 * 1024

    def __post_init__(self):
        if not callable(self.argv) and (isinstance(self.argv, str) or not self.argv or not all(
                isinstance(a, str) for a in self.argv)):
            raise ValueError(f"argv={self.argv!r}: give the command as a non-empty list of strings, e.g. "
                             "['mini', '-y'], or a function task_row -> list")
        if self.output_limit < 2:
            raise ValueError(f"output_limit={self.output_limit}: give a number of bytes >= 2 (e.g. 65536)")

    def __call__(self, task: dict, session: AgentSession) -> AgentResult:
        run = self.run(task, session)
        if run.killed:
            raise RuntimeError("the command was killed: its episode ended")
        if run.returncode != 0:
            raise RuntimeError(f"the command {self._argv(task)[0]!r} exited with status {run.returncode}; its "
                               f"output ended with: {run.output[-1500:]}")
        if self.score is not None:
            return _as_result(self.score(task, run), run)
        if run.result is None:
            raise ValueError("the command wrote no reward to $TRL_MULTITURN_RESULT: write a number or "
                             "{\"reward\": ..., \"won\": ...} there, or give AgentCommand a score= function")
        result = run.result
        if isinstance(result, dict):
            unknown = set(result) - {"reward", "won", "turn_rewards", "info"}
            if unknown:
                raise ValueError(f"$TRL_MULTITURN_RESULT holds unknown fields {sorted(unknown)}: write reward, won, "
                                 "turn_rewards, info")
            result = AgentResult(**result)
        return _as_result(result, run)

    def run(self, task: dict, session: AgentSession) -> CommandRun:
        """Run the command for one episode (see the module docstring) and say how it ended."""
        folder = Path(tempfile.mkdtemp(prefix="trl-agent-"))
        try:
            task_file, result_file = folder / "task.json", folder / "result.json"
            task_file.write_text(json.dumps(task, default=str))
            work = folder / "work"
            work.mkdir()
            env = {**os.environ, **endpoint_environment(session), "TRL_MULTITURN_TASK": str(task_file),
                   "TRL_MULTITURN_RESULT": str(result_file)}
            extra = self.env(task, session) if callable(self.env) else (self.env or {})
            env.update({str(k): str(v) for k, v in extra.items()})
            start = time.monotonic()
            # the thread that starts it waits for it (`_wait_or_kill`), so the parent-death signal comes only with
            # the trainer's death
            process = subprocess.Popen([*DIE_WITH_TRAINER, *self._argv(task)], cwd=self.cwd or work, env=env,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            output = _BoundedOutput(process.stdout, self.output_limit)
            killed = _wait_or_kill(process, session.stop)
            output.close()
            return CommandRun(process.returncode, output.text(), _read_result(result_file),
                              time.monotonic() - start, killed)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _argv(self, task: dict) -> list[str]:
        argv = self.argv(task) if callable(self.argv) else self.argv
        return [str(a) for a in argv]


def endpoint_environment(session: AgentSession) -> dict[str, str]:
    """The variables that point the usual clients (OpenAI's, Anthropic's, litellm) at the episode's endpoint."""
    root = session.base_url.removesuffix("/v1")
    return {"OPENAI_BASE_URL": session.base_url, "OPENAI_API_BASE": session.base_url,
            "OPENAI_API_KEY": session.api_key, "ANTHROPIC_BASE_URL": root, "ANTHROPIC_API_KEY": session.api_key,
            "ANTHROPIC_AUTH_TOKEN": session.api_key, "TRL_MULTITURN_MODEL": session.model}


def _wait_or_kill(process: subprocess.Popen, stop) -> bool:
    """Wait for `process` to exit, killing its group if `stop` is set first; then kill what is left of its group
    (while the exited leader is not yet reaped, so the group's id cannot have been reused). True if killed."""
    killed = False
    while True:
        try:
            exited = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:  # reaped already (cannot happen here unless someone else waited on it)
            exited = True
        if exited:
            break
        if stop.wait(POLL_SECONDS):
            killed = True
            _kill_group(process.pid)
            process.wait()
            return killed
    _kill_group(process.pid)
    process.wait()
    return killed


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _BoundedOutput:
    """Reads a pipe to its end on a thread of its own, keeping the first and last `limit / 2` bytes."""

    def __init__(self, pipe, limit: int):
        self.pipe, self.half = pipe, limit // 2
        self.head, self.tail, self.dropped = bytearray(), bytearray(), 0
        self.thread = threading.Thread(target=self._read, name="agent-command-output", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for chunk in iter(lambda: self.pipe.read1(65536), b""):
            room = self.half - len(self.head)
            self.head += chunk[:room]
            self.tail += chunk[max(room, 0):]
            if len(self.tail) > self.half:
                self.dropped += len(self.tail) - self.half
                del self.tail[: len(self.tail) - self.half]

    def close(self) -> None:
        # The group is dead; a process that left it (setsid) may still hold the pipe: do not wait for it long.
        self.thread.join(timeout=5)
        self.pipe.close()

    def text(self) -> str:
        marker = f"\n[... {self.dropped} bytes of output dropped ...]\n".encode() if self.dropped else b""
        return bytes(self.head + marker + self.tail).decode(errors="replace")


def _read_result(path: Path):
    """The JSON the command wrote to its result file, or None; a file that is not JSON raises (fails the episode)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"$TRL_MULTITURN_RESULT holds {text[:80]!r}, which is not JSON: write a number or "
                         "{\"reward\": ..., \"won\": ...}") from None


def _as_result(result, run: CommandRun) -> Union[float, AgentResult]:
    """`result` with the command's exit status and time in its info (an AgentResult), or the bare reward."""
    if isinstance(result, AgentResult):
        result.info = {**result.info, "command": {"returncode": run.returncode, "seconds": round(run.seconds, 3)}}
    return result
