"""Environments for a batch of concurrent episodes, in this process or in worker processes.

Each episode of a batch owns a *slot*; a slot keeps its environment instance across batches (construct once,
reset often). With `num_workers == 0` the environments live in this process and a crash (an exception) fails only
its own episode. With `num_workers > 0` slot `i` lives in worker `i % num_workers`; every worker runs its slots'
calls while the others run theirs, and a worker that exceeds `timeout` seconds or dies is killed, fails the
episodes it held, and is started afresh at the next reset. Timeouts need workers: a call in this process cannot be
interrupted safely.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..envs.base import Environment, StepResult


@dataclass
class EnvFailure:
    """An environment call that did not return: an exception, a timeout or a lost worker."""

    reason: str


def _apply(envs: dict[int, Environment], factory: Callable[[], Environment], cmd: str, items) -> list:
    """Run one command on several slots; an exception fails only its slot (and drops its instance)."""
    out = []
    for slot, arg in items:
        try:
            if cmd == "reset":
                if slot not in envs:
                    envs[slot] = factory()
                out.append(envs[slot].reset(arg))
            elif cmd == "step":
                out.append(envs[slot].step(arg))
            elif cmd == "finish":
                out.append(envs[slot].finish())
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception as exc:  # noqa: BLE001 - any environment error fails its episode, not the run
            out.append(EnvFailure(f"{cmd} raised {type(exc).__name__}: {exc}"))
            _close_quietly(envs.pop(slot, None))
    return out


def _close_quietly(env: Environment | None) -> None:
    if env is None:
        return
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing a broken environment must not fail the run
        pass


def _worker_main(conn, factory) -> None:
    envs: dict[int, Environment] = {}
    while True:
        try:
            cmd, items = conn.recv()
        except EOFError:
            break
        if cmd == "close":
            break
        conn.send(_apply(envs, factory, cmd, items))
    for env in envs.values():
        _close_quietly(env)


class EnvPool:
    """Runs `reset`, `step` and `finish` for many episode slots at once.

    Args:
        factory: callable returning a fresh `Environment`. With workers it is sent to them (under the default
            "fork" start method any callable works; "spawn"/"forkserver" need a picklable one).
        num_workers: 0 runs environments in this process; N > 0 spreads the slots over N worker processes.
        timeout: seconds a worker may take for one call over its slots before it is killed (workers only).
        start_method: multiprocessing start method for workers.
    """

    def __init__(self, factory: Callable[[], Environment], num_workers: int = 0, timeout: float | None = None,
                 start_method: str = "fork"):
        if num_workers < 0:
            raise ValueError(f"env_num_workers={num_workers}: use 0 (in-process) or a positive number of processes")
        self.factory = factory
        self.num_workers = num_workers
        self.timeout = timeout
        self._ctx = mp.get_context(start_method) if num_workers else None
        self._local: dict[int, Environment] = {}
        self._workers: dict[int, tuple[Any, Any]] = {}  # worker index -> (process, connection)

    def reset(self, tasks: list[dict]) -> list[str | EnvFailure]:
        """Reset slot i with tasks[i]; returns the first observation or a failure per slot."""
        return self._run("reset", list(enumerate(tasks)))

    def step(self, slots: list[int], actions: list[str]) -> list[StepResult | EnvFailure]:
        return self._run("step", list(zip(slots, actions)))

    def finish(self, slots: list[int]) -> list[StepResult | None | EnvFailure]:
        return self._run("finish", [(slot, None) for slot in slots])

    def close(self) -> None:
        for env in self._local.values():
            _close_quietly(env)
        self._local.clear()
        for index in list(self._workers):
            proc, conn = self._workers.pop(index)
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()

    def __del__(self):
        self.close()

    # -- internals ---------------------------------------------------------------------------------------------------

    def _run(self, cmd: str, items: list[tuple[int, Any]]) -> list:
        if not items:
            return []
        if not self.num_workers:
            return _apply(self._local, self.factory, cmd, items)
        by_worker: dict[int, list[tuple[int, Any]]] = {}
        for slot, arg in items:
            by_worker.setdefault(slot % self.num_workers, []).append((slot, arg))
        for index, worker_items in by_worker.items():
            self._send(index, cmd, worker_items)
        results: dict[int, Any] = {}
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        for index, worker_items in by_worker.items():
            for (slot, _), result in zip(worker_items, self._receive(index, deadline, len(worker_items))):
                results[slot] = result
        return [results[slot] for slot, _ in items]

    def _send(self, index: int, cmd: str, items) -> None:
        if index not in self._workers:
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(target=_worker_main, args=(child, self.factory), daemon=True)
            proc.start()
            child.close()
            self._workers[index] = (proc, parent)
        try:
            self._workers[index][1].send((cmd, items))
        except (BrokenPipeError, OSError):
            pass  # the receive below reports the dead worker

    def _receive(self, index: int, deadline: float | None, count: int) -> list:
        proc, conn = self._workers[index]
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            if conn.poll(remaining):
                return conn.recv()
            reason = f"environment worker timed out after {self.timeout}s"
        except (EOFError, OSError):
            reason = f"environment worker died (exit code {proc.exitcode})"
        proc.kill()
        proc.join(timeout=5)
        del self._workers[index]
        return [EnvFailure(reason)] * count
