"""`trl-multiturn serve`: one of our environments as an OpenEnv server (`openenv-core`, the `openenv` extra).

    trl-multiturn serve --env textworld --host 127.0.0.1 --port 8000
    trl-multiturn serve --env textworld --option games_dir=games --task '{"world_size": 2, "nb_objects": 3,
        "quest_length": 4}' --max-sessions 64

OpenEnv's clients (`GenericEnvClient`, and the frameworks that speak OpenEnv) then play it over a WebSocket
session: `reset(task={...})` (or `reset(seed=N)` with `--task`), `step({"message": "open box"})`. A trainer of
this package connects with `environment_factory=partial(OpenEnvEnvironment, base_url="http://HOST:8000")`. The
wire format and the failure semantics are in `trl_multiturn/commands/openenv_server.py`.

`--env` takes any registered environment (`trl_multiturn.envs.suites.SUITES`). `LocalServer` runs
the command in a subprocess on a free port of this machine and waits until it answers (tests, benchmarks, a
trainer that wants its environments in a separate process).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from ..envs.suites import SUITES


def environment_factory(name: str, options: dict | None = None):
    """The factory of the registered environment `name` (`envs.suites.SUITES`), built with the settings
    `options`."""
    return SUITES.lookup(name).factory(**(options or {}))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalServer:
    """`trl-multiturn serve --env ENV ...` in a subprocess (its own process group) on `port` (default: a free one);
    `options` are the environment's keyword arguments (`--option`), `args` further options of the command.

    `start()` (or `with LocalServer(...) as server:`) returns once `GET /health` answers, within `ready_timeout`
    seconds, or raises naming the server's output; `server.url` is then its address. `kill()` ends it at once
    (SIGKILL to its process group: the server and its environment workers), `close()` gracefully first.
    """

    def __init__(self, env: str, options: dict | None = None, *args: str, host: str = "127.0.0.1",
                 port: int | None = None, ready_timeout: float = 300.0):
        self.port = free_port(host) if port is None else port
        self.url = f"http://{host}:{self.port}"
        self.command = [sys.executable, "-m", "trl_multiturn.commands.cli", "serve", "--env", env, "--host", host,
                        "--port", str(self.port), *args]
        for key, value in (options or {}).items():
            self.command += ["--option", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def start(self) -> LocalServer:
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the OpenEnv server exited with code {self.process.returncode}: {self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"the OpenEnv server did not answer on {self.url} within {self.ready_timeout}s: "
                           f"{self.output()}")

    def output(self) -> str:
        """What the server printed so far (its last 4000 characters)."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        self._log.close()

    def _signal(self, signum) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            return
        if signum == signal.SIGKILL:
            self.process.wait()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _option(text: str) -> tuple[str, object]:
    """`KEY=VALUE`; VALUE is read as JSON when it parses (numbers, true/false, objects), else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"bad option {text!r}: write KEY=VALUE, e.g. games_dir=games")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"bad --task {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"bad --task {text!r}: give a JSON object (a task row)")
    return value


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text}: give a number > 0")
        return value
    return parse


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .openenv_server import served_app

    factory = environment_factory(args.env, dict(args.option))
    app = served_app(factory, max_sessions=args.max_sessions, env_mode=args.env_mode, env_timeout=args.env_timeout,
                     task_defaults=args.task)
    print(f"serving {args.env} over OpenEnv on http://{args.host}:{args.port} (WebSocket sessions on /ws, "
          f"up to {args.max_sessions})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_serve_parser(subparsers) -> None:
    """Register `trl-multiturn serve` on the CLI's subparsers."""
    parser = subparsers.add_parser(
        "serve", help="Serve an environment over OpenEnv's protocol (HTTP/WebSocket), for remote trainers and other "
                      "frameworks.",
        description="Serve an environment as an OpenEnv server: each WebSocket session on /ws plays episodes on its "
                    "own environment (reset with the task row, step with {\"message\": reply}). Needs the `openenv` "
                    "extra.")
    parser.add_argument("--env", required=True, choices=sorted(SUITES), help="The environment to serve.")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind. Default: 127.0.0.1 (this machine only; "
                                                            "0.0.0.0 serves other hosts).")
    parser.add_argument("--port", type=int, default=8000, help="Port to listen on. Default: 8000.")
    parser.add_argument("--option", type=_option, action="append", default=[], metavar="KEY=VALUE",
                        help="A keyword argument of the environment class, e.g. games_dir=games; repeatable.")
    parser.add_argument("--task", type=_json_object, default=None, metavar="JSON",
                        help="Fields filled into every reset's task row where it lacks them, e.g. "
                             "'{\"world_size\": 2, \"nb_objects\": 3, \"quest_length\": 4}' so that reset(seed=N) "
                             "plays game N.")
    parser.add_argument("--max-sessions", type=_positive(int), default=64,
                        help="Most sessions (concurrent episodes) at once; one more is refused. Default: 64.")
    parser.add_argument("--env-mode", default="auto", choices=["auto", "process", "thread", "inline"],
                        help="How each session runs its environment (the trainers' env_mode). Default: auto (what "
                             "the environment declares; TextWorld: a worker process per session).")
    parser.add_argument("--env-timeout", type=_positive(float), default=None,
                        help="Seconds one reset/step may take before the call fails with an error reply. Default: "
                             "the environment's declared call_timeout, else none.")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn's log level. Default: warning.")
    parser.set_defaults(func=_serve)
