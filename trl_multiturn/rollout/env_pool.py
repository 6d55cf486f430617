"""Environments for a batch of concurrent episodes, each episode slot isolated from the others.

Each episode of a batch owns a *slot*; a slot keeps its environment instance across batches (construct once, reset
often). Every call of a batch (`reset`, `step` or `finish` of each slot) starts at once and has its own deadline,
`timeout` seconds after it started (`start_step` returns while the steps run, for a caller with other work to do
meanwhile), so an environment that raises, breaks the contract, hangs or dies fails its own episode and no other.
Each mode is a runner (`env_runner.EnvRunner`; `RUNNERS` names them), chosen once when the pool is built. Modes:

* "process": each slot's environment lives in its own worker process, forked on first use. A call past its
  deadline kills that worker (and its process group); a worker that dies fails only its episode; the slot's next
  reset starts a fresh worker. Workers die with the process that owns the pool, and a worker whose private memory
  exceeds `max_memory_mb` is restarted between episodes. For CPU-bound engines (TextWorld, ALFWorld), and the safe
  choice for any environment.
* "thread": each call runs on its own thread of this process, for environments whose work waits on I/O or on a
  subprocess (SWE-Gym's sandboxes): the same overlap without a process per episode. Python cannot kill a thread: a
  call past its deadline fails its episode, its environment is dropped (and closed when the call returns), and the
  slot's next reset builds a fresh one.
* "ray": each slot's environment is a Ray actor, placed by Ray on any node of a cluster (`ray_pool`): the process
  mode's contract (a call past its deadline kills its actor; an actor or a node that dies fails only its episodes)
  for environments that should live on other machines, e.g. CPU nodes beside the GPU nodes that train.
* "inline": calls run in this process one after another, without deadlines: for debugging (breakpoints, pdb).
* "auto": the mode the environment declares (`Environment.execution`, read from the factory: a class, a
  `functools.partial` of one, or any callable with an `execution` attribute); "process" if it declares none.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from typing import Any, Callable

import psutil

from ..envs.base import Environment, StepResult
from .env_runner import EnvRunner, RunnerOptions, SlotHandle
from .ray_pool import RayRunner
from .slot_env import EnvFailure, SlotEnvironment

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def declared(factory: Callable[[], Environment], name: str, default):
    """What an environment factory declares as `name`: the attribute of the factory (an `Environment` class has
    `execution` and `observation_role`), of the function inside a `functools.partial`, or `default` when there is
    none (e.g. a lambda)."""
    target = factory
    while isinstance(target, functools.partial):
        target = target.func
    return getattr(target, name, default)


def declared_execution(factory: Callable[[], Environment]) -> str:
    """The mode an environment factory declares (`Environment.execution`), "process" when it declares none."""
    mode = declared(factory, "execution", "process")
    if mode not in ("process", "thread", "inline"):
        raise ValueError(f"{declared(factory, '__name__', factory)!r}.execution={mode!r}: use 'process' or 'thread'")
    return mode


def check_env_settings(mode: str, timeout: float | None, max_memory_mb: float | None) -> None:
    """Refuse settings that cannot work, naming the config field and the fix (`mode` may still be "auto")."""
    if mode not in ENV_MODES:
        raise ValueError(f"env_mode={mode!r}: choose one of {ENV_MODES} ('inline' runs environments in this process "
                         "one after another, for debugging)")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"env_timeout={timeout}: give a number of seconds > 0, or None for no deadline")
    if max_memory_mb is not None and not max_memory_mb > 0:
        raise ValueError(f"env_max_memory_mb={max_memory_mb}: give a number of MiB > 0, or None for no limit")
    if mode != "auto":  # the mode's own refusals wait until "auto" is resolved
        RUNNERS[mode].check_settings(timeout, max_memory_mb)


def resolve_env_mode(mode: str, factory: Callable[[], Environment]) -> str:
    check_env_settings(mode, None, None)
    return declared_execution(factory) if mode == "auto" else mode


class _user_interrupts:
    """Around an inline call in the main thread: a SIGINT that arrives meanwhile (the user's Ctrl-C) is recorded, so
    that the KeyboardInterrupt it raises is told apart from one the environment's code raises and stops the run."""

    def __enter__(self):
        self.received, self.previous = False, None
        if threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT)):
            self.previous = signal.signal(signal.SIGINT, self._handle)  # (an ignored SIGINT stays ignored)
        return self

    def _handle(self, signum, frame):
        self.received = True
        self.previous(signum, frame)

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        if self.received:
            raise KeyboardInterrupt


class _InlineSlot:
    """The slot's calls run in this process, during `start`."""

    lost = False

    def __init__(self, factory):
        self.slot_env = SlotEnvironment(factory)
        self._result = None

    def start(self, cmd: str, arg: Any) -> None:
        with _user_interrupts():
            self._result = self.slot_env.call(cmd, arg)

    def wait(self, deadline: float | None):
        return self._result

    def finished(self) -> bool:
        return True

    def close(self) -> None:
        self.slot_env.close()


class _ThreadCall:
    """One call on a daemon thread of its own. Abandoned past its deadline, it closes its environment on return."""

    def __init__(self, slot_env: SlotEnvironment, cmd: str, arg: Any):
        self.slot_env, self.result, self.abandoned = slot_env, None, False
        self.done, self.lock = threading.Event(), threading.Lock()
        threading.Thread(target=self._run, args=(cmd, arg), daemon=True, name=f"env-{cmd}").start()

    def _run(self, cmd: str, arg: Any) -> None:
        result = self.slot_env.call(cmd, arg)  # never raises: a user's Ctrl-C goes to the main thread, not here
        with self.lock:
            self.result = result
            self.done.set()
            if self.abandoned:
                self.slot_env.close()

    def finished_by(self, deadline: float | None) -> bool:
        """Wait until `deadline`; False (and the call is abandoned) if it has not returned by then."""
        self.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self.lock:
            self.abandoned = not self.done.is_set()
            return not self.abandoned


class _ThreadSlot:
    """Each call on its own thread. A call past its deadline fails; its environment is dropped (and closed when the
    call returns) and the slot starts over with a fresh one."""

    lost = False

    def __init__(self, factory, timeout: float | None):
        self.slot_env = SlotEnvironment(factory)
        self.timeout = timeout
        self._call: _ThreadCall | None = None

    def start(self, cmd: str, arg: Any) -> None:
        self._call = _ThreadCall(self.slot_env, cmd, arg)

    def wait(self, deadline: float | None):
        if self._call.finished_by(deadline):
            return self._call.result
        self.slot_env = SlotEnvironment(self.slot_env.factory)
        return EnvFailure(f"environment call timed out after {self.timeout}s (its thread was abandoned)")

    def finished(self) -> bool:
        return self._call.done.is_set()

    def close(self) -> None:
        self.slot_env.close()  # an abandoned call closes its own (replaced) environment


def _die_with_parent(parent_pid: int, use_pdeathsig: bool) -> None:
    """In a worker: be killed when the pool's process dies, even while an environment call hangs. Linux's
    PR_SET_PDEATHSIG delivers SIGKILL when the thread that forked us exits (so it is used only when that is the main
    thread); a watchdog thread polling the parent pid covers the other cases."""
    prctl = _libc_prctl() if use_pdeathsig else None
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)  # the parent died before the signal was armed

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def _exit_call(signum, frame):
    """In a worker, during an environment call: SIGTERM (from `join_or_kill`) ends the call as a failure, so that
    the environment is still closed (its folders removed) before the worker exits."""
    raise SystemExit(128 + signum)


def _worker_main(conn, factory, parent_pid: int, use_pdeathsig: bool) -> None:
    _die_with_parent(parent_pid, use_pdeathsig)
    os.setpgid(0, 0)  # a process group of its own: a kill reaches what the environment started
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it closes its workers
    slot_env = SlotEnvironment(factory)
    while True:
        try:
            cmd, arg = conn.recv()
        except (EOFError, OSError):
            break
        if cmd == "close":
            break
        signal.signal(signal.SIGTERM, _exit_call)
        result = slot_env.call(cmd, arg)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            conn.send(result)
        except (BrokenPipeError, OSError):
            break
        except Exception as exc:  # noqa: BLE001 - a result that cannot be pickled fails its episode
            slot_env.close()
            conn.send(EnvFailure(f"{cmd} returned a result the worker cannot send back ({type(exc).__name__}: "
                                 f"{exc}); keep StepResult.info to plain data"))
    slot_env.close()


@functools.cache
def _libc_prctl():
    """libc's prctl (None off Linux). Looked up in the parent before forking: a forked child of a threaded process
    must not dlopen or dlsym, and inherits this cache."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _unpickled(message: bytes):
    """A worker's result, or its episode's failure when it pickled in the worker but does not unpickle here (e.g.
    an exception in `info` whose `__init__` takes other arguments than it stores)."""
    try:
        return pickle.loads(message)
    except Exception as exc:  # noqa: BLE001 - whatever the unpickling code raises is the result's fault
        return EnvFailure(f"the environment's result could not be read back from its worker ({type(exc).__name__}: "
                          f"{exc}); keep StepResult.info to plain data")


class _WorkerSlot:
    """The slot's environment in a worker process of its own."""

    def __init__(self, factory, ctx, timeout: float | None):
        self.timeout = timeout
        self.lost = False
        use_pdeathsig = threading.current_thread() is threading.main_thread() and _libc_prctl() is not None
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, factory, os.getpid(), use_pdeathsig), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self._unsent: EnvFailure | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def private_memory_mb(self) -> float:
        """Memory the worker does not share with other processes (its unique set size), in MiB."""
        return psutil.Process(self.pid).memory_full_info().uss / 2**20

    def start(self, cmd: str, arg: Any) -> None:
        self._unsent = None
        try:
            self.conn.send((cmd, arg))
        except (BrokenPipeError, OSError):
            pass  # a dead worker: `wait` reports it
        except Exception as exc:  # noqa: BLE001 - e.g. a task row that cannot be pickled
            self._unsent = EnvFailure(f"{cmd}: could not send {type(arg).__name__} to the environment worker "
                                      f"({type(exc).__name__}: {exc})")

    def wait(self, deadline: float | None):
        if self._unsent is not None:
            return self._unsent
        try:
            if self.conn.poll(None if deadline is None else max(0.0, deadline - time.monotonic())):
                return _unpickled(self.conn.recv_bytes())
            reason = f"environment call timed out after {self.timeout}s (its worker was killed)"
        except (EOFError, OSError):
            self.kill()  # reaches what the dead worker left running in its process group
            return EnvFailure(f"environment worker died (exit code {self.proc.exitcode})")
        self.kill()
        return EnvFailure(reason)

    def finished(self) -> bool:
        """Whether `wait` would return at once: the result (or the end of a dead worker's pipe) has arrived."""
        if self._unsent is not None:
            return True
        try:
            return self.conn.poll(0)
        except (EOFError, OSError):
            return True

    def request_close(self) -> None:
        try:
            self.conn.send(("close", None))
        except Exception:  # noqa: BLE001 - a dead worker is closed already
            pass

    def join_or_kill(self, deadline: float) -> None:
        # Wait for the exit without reaping: the worker's pid, hence its process group's id, stays ours, so the kill
        # reaches the children its environment started and its close() left running.
        if not mp.connection.wait([self.proc.sentinel], timeout=max(0.0, deadline - time.monotonic())):
            os.kill(self.pid, signal.SIGTERM)  # a call that hangs: ends as a failure, the environment is closed
            mp.connection.wait([self.proc.sentinel], timeout=5.0)
        self.kill()

    def close(self) -> None:
        self.request_close()
        self.join_or_kill(time.monotonic() + 5.0)

    def kill(self) -> None:
        """SIGKILL the worker and its process group, but only while its pid is still ours (running, or exited and
        not yet reaped): once reaped, the number may name another process."""
        self.lost = True
        if self._pid_is_ours():
            for kill in (os.killpg, os.kill):
                try:
                    kill(self.pid, signal.SIGKILL)
                except OSError:
                    pass
        self.proc.join(timeout=5)
        self.conn.close()

    def _pid_is_ours(self) -> bool:
        try:  # a child of ours that runs, or exited and is not reaped yet
            os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            return True
        except ChildProcessError:  # reaped, or not our child ("forkserver"): ask multiprocessing
            return self.proc.exitcode is None


def _refuse_memory_limit_in_process(mode: str, max_memory_mb: float | None) -> None:
    if max_memory_mb is not None:
        raise ValueError(f"env_max_memory_mb needs worker processes, and the environments run in mode {mode!r} "
                         "inside this process: set env_mode='process' or drop the limit")


class InlineRunner(EnvRunner):
    """"inline": each call runs in this process during `start`, one after another, without deadlines."""

    deadlines = False

    @classmethod
    def check_settings(cls, timeout: float | None, max_memory_mb: float | None) -> None:
        if timeout is not None:
            raise ValueError("env_timeout needs env_mode 'auto', 'process', 'thread' or 'ray': an inline call cannot "
                             "be interrupted")
        _refuse_memory_limit_in_process("inline", max_memory_mb)

    def new_slot(self) -> _InlineSlot:
        return _InlineSlot(self.factory)


class ThreadRunner(EnvRunner):
    """"thread": each call on a thread of its own; a call past its deadline is abandoned with its environment."""

    @classmethod
    def check_settings(cls, timeout: float | None, max_memory_mb: float | None) -> None:
        _refuse_memory_limit_in_process("thread", max_memory_mb)

    def new_slot(self) -> _ThreadSlot:
        return _ThreadSlot(self.factory, self.timeout)


class ProcessRunner(EnvRunner):
    """"process": each slot's environment in a worker process of its own, restarted between episodes when it dies or
    exceeds `max_memory_mb`."""

    def __init__(self, factory: Callable[[], Environment], timeout: float | None, options: RunnerOptions):
        super().__init__(factory, timeout, options)
        self._ctx = mp.get_context(options.start_method)

    def new_slot(self) -> _WorkerSlot:
        return _WorkerSlot(self.factory, self._ctx, self.timeout)

    def open(self, slots: list[int]) -> None:
        """Restart the workers over the memory limit; drop a worker that died between episodes (e.g. killed from
        outside), so that its slot's reset starts afresh."""
        for slot in slots:
            if self.options.max_memory_mb is not None:
                self._restart_if_over_memory(slot)
            worker = self.slots.get(slot)
            if worker is not None and not worker.proc.is_alive():
                worker.kill()
                del self.slots[slot]

    def wait_any(self, handles: list[SlotHandle], timeout: float | None) -> None:
        """Wait on the workers' pipes directly."""
        mp.connection.wait([worker.conn for worker in handles], timeout=timeout)

    def close(self) -> None:
        """Ask every worker to close at once, then wait for them all (5 s in all) before killing what is left."""
        workers, self.slots = list(self.slots.values()), {}
        for worker in workers:
            worker.request_close()
        deadline = time.monotonic() + 5.0
        for worker in workers:
            worker.join_or_kill(deadline)

    def worker_pids(self) -> list[int]:
        return [worker.pid for worker in self.slots.values()]

    def _restart_if_over_memory(self, slot: int) -> None:
        worker = self.slots.get(slot)
        if worker is None:
            return
        try:
            used = worker.private_memory_mb()
        except psutil.Error:
            return  # a dead worker: `open` drops it
        limit = self.options.max_memory_mb
        if used > limit:
            log = logger.warning if self.restarts == 0 else logger.debug
            log("environment worker %d uses %.0f MiB > env_max_memory_mb=%s: restarting it", worker.pid, used, limit)
            worker.close()
            del self.slots[slot]
            self.restarts += 1


RUNNERS: dict[str, type[EnvRunner]] = {
    "process": ProcessRunner,
    "thread": ThreadRunner,
    "ray": RayRunner,
    "inline": InlineRunner,
}
ENV_MODES = ("auto", *RUNNERS)


class PendingCalls:
    """Environment calls started by `EnvPool.start_step` and still running; `results()` waits for them (once)."""

    def __init__(self, runner: EnvRunner, cmd: str, started: list[tuple[int, SlotHandle | None]],
                 deadline: float | None):
        self._runner, self._cmd, self._started, self._deadline = runner, cmd, started, deadline
        self._results: list | None = None

    def done(self) -> bool:
        """Whether `results()` would return without waiting: every call has returned (or failed), or the deadline
        has passed (the calls still running then fail as timed out)."""
        return (self._results is not None
                or (self._deadline is not None and time.monotonic() >= self._deadline)
                or all(handle is None or handle.finished() for _, handle in self._started))

    def results(self) -> list:
        """Per slot, in the order started: the call's result, or an `EnvFailure`."""
        if self._results is None:
            self._results = self._runner.collect(self._cmd, self._started, self._deadline)
        return self._results


class EnvPool:
    """Runs `reset`, `step` and `finish` for many episode slots at once, each slot isolated (see the module doc).

    Args:
        factory: callable returning a fresh `Environment`. Process workers are forked, so any callable works.
        mode: "auto", "process", "thread", "ray" or "inline" (the runner, `RUNNERS[mode]`, is chosen here once).
        timeout: seconds one call may take before its episode fails (None: the environment's declared
            `call_timeout`, else no deadline; not with "inline").
        max_memory_mb: restart a worker between episodes when its private memory exceeds this ("process" only).
        start_method: multiprocessing start method of the workers ("spawn"/"forkserver" need a picklable factory).
        ray: where the actors run ("ray" only; `ray_pool.RayPlacement`, None: its defaults).
    """

    def __init__(self, factory: Callable[[], Environment], mode: str = "auto", timeout: float | None = None,
                 max_memory_mb: float | None = None, start_method: str = "fork", ray=None):
        self.factory = factory
        self.mode = resolve_env_mode(mode, factory)
        check_env_settings(self.mode, timeout, max_memory_mb)  # "auto" resolved: e.g. threads refuse a memory cap
        runner = RUNNERS[self.mode]
        if timeout is None and runner.deadlines:
            timeout = declared(factory, "call_timeout", None)
        self.timeout = timeout
        self.max_memory_mb = max_memory_mb
        self.runner: EnvRunner = runner(factory, timeout, RunnerOptions(max_memory_mb, start_method, ray))

    @property
    def restarts(self) -> int:
        """Workers restarted for exceeding max_memory_mb."""
        return self.runner.restarts

    def reset(self, tasks: list[dict]) -> list[str | EnvFailure]:
        """Reset slot i with tasks[i]; returns the first observation or a failure per slot."""
        self.runner.open(list(range(len(tasks))))
        return self._run("reset", list(enumerate(tasks)))

    def step(self, slots: list[int], actions: list[str]) -> list[StepResult | EnvFailure]:
        return self.start_step(slots, actions).results()

    def start_step(self, slots: list[int], actions: list[str]) -> PendingCalls:
        """Start `step` of each slot and return at once: the steps run while the caller does other work (e.g.
        generates for other episodes); `.results()` waits for them. Each call's deadline counts from now. In
        "inline" mode the steps run here, before this returns."""
        return self._start("step", list(zip(slots, actions)))

    def wait_any(self, calls: list[PendingCalls]) -> list[int]:
        """Wait until at least one of `calls` is `done()`; the indices of those that are (the runner's `wait_any`:
        worker processes' pipes are waited on directly, threads and Ray actors polled)."""
        while True:
            done = [k for k, call in enumerate(calls) if call.done()]
            if done or not calls:
                return done
            deadlines = [call._deadline for call in calls if call._deadline is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            self.runner.wait_any([h for call in calls for _, h in call._started if h is not None], timeout)

    def finish(self, slots: list[int]) -> list[StepResult | None | EnvFailure]:
        return self._run("finish", [(slot, None) for slot in slots])

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers ("process" mode)."""
        return self.runner.worker_pids()

    def actor_nodes(self) -> dict[int, str]:
        """The Ray node id of each slot's live actor ("ray" mode)."""
        return self.runner.actor_nodes()

    def close(self) -> None:
        """Close every environment and stop every worker (gracefully, then by force after 5 s). The pool stays
        usable: the next reset starts what it needs."""
        self.runner.close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        runner = getattr(self, "runner", None)
        if runner is not None and runner.slots:
            self.close()

    # -- internals ---------------------------------------------------------------------------------------------------

    def _run(self, cmd: str, items: list[tuple[int, Any]]) -> list:
        return self._start(cmd, items).results()

    def _start(self, cmd: str, items: list[tuple[int, Any]]) -> PendingCalls:
        started = [(slot, self.runner.start(slot, cmd, arg)) for slot, arg in items]
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        return PendingCalls(self.runner, cmd, started, deadline)
