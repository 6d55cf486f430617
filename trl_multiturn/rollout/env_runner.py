"""The runner protocol: how an `EnvPool` runs its slots' environments. Each mode is one `EnvRunner` subclass
(`env_pool.RUNNERS`: inline, thread, process, and Ray's in `ray_pool`), chosen once when the pool is built; the pool
itself never asks which mode it runs.

A runner keeps one *slot handle* per episode slot that has an environment (`SlotHandle`: the environment itself, a
thread per call, a worker process, a Ray actor). The pool drives it in this order:

    open(slots)                     before a reset of `slots`, outside the calls' deadline
    start(slot, cmd, arg)           for each call of the batch, at once; the handle, or None without an environment
    collect(cmd, started, deadline) the results, each call failing on its own at `deadline`; lost handles dropped
    wait_any(handles, timeout)      while the caller waits for the first of several batches
    close()                         every environment closed, everything the runner started stopped
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol

from ..envs.base import Environment
from .slot_env import EnvFailure

ANY_POLL_S = 0.001  # `EnvRunner.wait_any`'s polling interval, for runners whose calls give no waitable handle


class SlotHandle(Protocol):
    """One slot's environment, as its runner hosts it: one call at a time."""

    lost: bool  # the host is gone (a killed worker, an abandoned thread's environment): the slot starts afresh

    def start(self, cmd: str, arg: Any) -> None:
        """Start `cmd(arg)` ("reset", "step" or "finish") and return at once (inline: after the call)."""

    def wait(self, deadline: float | None) -> Any:
        """The call's result, or an `EnvFailure` (past `deadline`, a crash, a result that does not travel)."""

    def finished(self) -> bool:
        """Whether `wait` would return at once."""

    def close(self) -> None:
        """Close the environment and release its host."""


@dataclass(frozen=True)
class RunnerOptions:
    """The pool's settings that some runners use: `max_memory_mb` (process), `start_method` (process), `ray`
    (Ray: a `ray_pool.RayPlacement`, None for its defaults)."""

    max_memory_mb: float | None = None
    start_method: str = "fork"
    ray: Any = None


class EnvRunner(ABC):
    """How one pool runs its slots' environments (see the module doc for the order of the calls).

    Subclasses give `new_slot` and may refine the steps below; they declare `deadlines` (whether a call can be
    interrupted at its deadline) and refuse, in `check_settings`, the settings they cannot honour.
    """

    deadlines: ClassVar[bool] = True

    def __init__(self, factory: Callable[[], Environment], timeout: float | None, options: RunnerOptions):
        self.factory, self.timeout, self.options = factory, timeout, options
        self.slots: dict[int, SlotHandle] = {}
        self.restarts = 0  # hosts restarted for exceeding max_memory_mb

    @classmethod
    def check_settings(cls, timeout: float | None, max_memory_mb: float | None) -> None:
        """Refuse settings this mode cannot honour, naming the config field and the fix (the pool's generic checks
        have passed)."""

    @abstractmethod
    def new_slot(self) -> SlotHandle:
        """A fresh host for one slot's environment."""

    def open(self, slots: list[int]) -> None:
        """Before a reset of `slots`, outside the calls' deadline: make ready what their reset needs."""

    def start(self, slot: int, cmd: str, arg: Any) -> SlotHandle | None:
        """Start `cmd(arg)` on the slot's environment (a reset gives a slot without one a fresh host); None when the
        slot has no environment (its reset failed)."""
        handle = self.slots.get(slot)
        if handle is None and cmd != "reset":
            return None
        if handle is None:
            handle = self.slots[slot] = self.new_slot()
        handle.start(cmd, arg)
        return handle

    def collect(self, cmd: str, started: list[tuple[int, SlotHandle | None]], deadline: float | None) -> list:
        """Per started call, in order: its result or an `EnvFailure`; a slot whose host was lost loses its handle."""
        self.wait_all([handle for _, handle in started if handle is not None], deadline)
        results = []
        for slot, handle in started:
            if handle is None:
                results.append(EnvFailure(f"{cmd} of a slot that has no environment (its reset failed)"))
                continue
            results.append(handle.wait(deadline))
            if handle.lost and self.slots.get(slot) is handle:
                del self.slots[slot]
        return results

    def wait_all(self, handles: list[SlotHandle], deadline: float | None) -> None:
        """Before `collect` waits on each handle in turn: a runner that can wait for a whole batch at once does."""

    def wait_any(self, handles: list[SlotHandle], timeout: float | None) -> None:
        """Block until one of `handles` may have finished, or `timeout` seconds (None: no limit) have passed; a
        spurious return is allowed (the caller asks `finished()`). This default polls every `ANY_POLL_S` seconds."""
        time.sleep(ANY_POLL_S if timeout is None else min(ANY_POLL_S, timeout))

    def close(self) -> None:
        """Close every environment and stop what the runner started. The runner stays usable: the next reset starts
        what it needs."""
        handles, self.slots = list(self.slots.values()), {}
        for handle in handles:
            handle.close()

    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes this runner started on this machine (none but "process")."""
        return []

    def actor_nodes(self) -> dict[int, str]:
        """The Ray node id of each slot's live actor (none but "ray")."""
        return {}
