"""Environments as Ray actors (`EnvPool(mode="ray")`, its `RayRunner`): one actor per episode slot, on any node of a
Ray cluster.

The contract is the process pool's: a slot's actor is created on its first reset and reused across episodes; every
call of a batch is submitted at once (one actor task per live episode) and the results are gathered together with
`ray.wait` against the batch's deadline. A call past its deadline closes its environment (each actor has a second
thread, so `close()` runs beside the hung call and stops what the environment started outside the actor's process: a
container, a server) and then kills its actor (`ray.kill`); an actor that dies
(its process exits, its node is lost) fails only its episode; a result that breaks the environment contract is
checked inside the actor (`SlotEnvironment`) and fails its episode. A lost actor is dropped and the slot's next
reset creates a fresh one, which Ray places on a node that is still there.

Where the actors live: `RayPlacement.address` names the cluster ("auto" joins the one `ray start` runs on this
machine, "ray://host:10001" a remote one through Ray Client, "local" starts a new local cluster; None: Ray's
default, `RAY_ADDRESS` if set, else the latest cluster started on this machine, else a new local one). A process
that already called `ray.init` keeps its connection. What the pool starts it stops: `close()` kills every actor, and
shuts Ray down when the pool was the one to call `ray.init` (a local cluster it started goes with it). When the
trainer's process dies, Ray kills the actors it owns and a local cluster's processes share its fate.

The environment factory is sent to the actors with Ray's cloudpickle, so its module must be importable on every
node (install the package there, or use a Ray `runtime_env`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..config_checks import parse_json_dict
from .env_runner import EnvRunner, RunnerOptions, SlotHandle
from .slot_env import EnvFailure, SlotEnvironment

logger = logging.getLogger(__name__)

RAY_SCHEDULING = ("DEFAULT", "SPREAD")
# Seconds a new actor may take to be placed and to start (a worker process importing the environment's modules) before
# its episode fails; not counted against `env_timeout`, which bounds the environment's own calls.
ACTOR_START_TIMEOUT = 600.0
# Seconds the environments of timed-out calls get to close (all of them at once) before their actors are killed.
CLOSE_TIMEOUT = 5.0


@dataclass(frozen=True)
class RayPlacement:
    """Where and with what each environment actor runs (the trainer config's `env_ray_*` fields).

    Args:
        address: the Ray cluster to join ("auto", "ray://host:10001", "host:6379"), "local" for a new local cluster
            started by the pool, or None: `RAY_ADDRESS` if set, else the latest cluster started on this machine, else
            a new local one.
        num_cpus: CPUs Ray reserves for each actor (fractions pack several per core).
        resources: custom resources each actor needs, e.g. {"env_node": 0.01} to keep environments on the nodes
            started with `--resources='{"env_node": 100}'`.
        scheduling: Ray's scheduling strategy: "DEFAULT" (fill nodes) or "SPREAD" (across nodes).
    """

    address: str | None = None
    num_cpus: float = 1.0
    resources: dict[str, float] | None = None
    scheduling: str = "DEFAULT"


def check_ray_placement(mode: str, placement: RayPlacement) -> None:
    """Refuse settings that cannot work, naming the trainer config's field and the fix."""
    if placement != RayPlacement() and mode != "ray":
        changed = [f"env_ray_{name}" for name in ("address", "num_cpus", "resources", "scheduling")
                   if getattr(placement, name) != getattr(RayPlacement(), name)]
        raise ValueError(f"{', '.join(changed)} place environments on a Ray cluster, but env_mode={mode!r}: set "
                         "env_mode='ray' or drop them")
    if not (isinstance(placement.num_cpus, (int, float)) and placement.num_cpus >= 0):
        raise ValueError(f"env_ray_num_cpus={placement.num_cpus!r}: give a number of CPUs >= 0 (e.g. 0.25)")
    for name, amount in (placement.resources or {}).items():
        if not (isinstance(name, str) and isinstance(amount, (int, float)) and not isinstance(amount, bool)
                and 0 <= amount < float("inf")):
            raise ValueError(f"env_ray_resources[{name!r}]={amount!r}: give a resource name and a finite amount >= 0, "
                             "e.g. {\"env_node\": 0.01}")
    if placement.scheduling not in RAY_SCHEDULING:
        raise ValueError(f"env_ray_scheduling={placement.scheduling!r}: choose one of {RAY_SCHEDULING} ('SPREAD' "
                         "spreads the environments across the nodes)")


def parse_ray_resources(value: dict | str | None) -> dict | None:
    """`env_ray_resources` as a dict: a dict or None as given, a string parsed as a JSON object."""
    return parse_json_dict("env_ray_resources", value, '{"env_node": 0.01}')


def _ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError("env_mode='ray' needs Ray: pip install 'trl-multiturn[ray]'") from exc
    return ray


class _EnvActor:
    """The body of one slot's actor: the slot's environment, checked against the contract like a worker's."""

    def __init__(self, factory: Callable):
        self.slot_env = SlotEnvironment(factory)

    def call(self, cmd: str, arg: Any):
        return self.slot_env.call(cmd, arg)

    def node_id(self) -> str:
        return _ray().get_runtime_context().get_node_id()

    def close(self) -> None:
        self.slot_env.close()


class _ActorSlot:
    """One slot's environment actor (a `SlotHandle`)."""

    def __init__(self, actor, timeout: float | None):
        self.actor, self.timeout = actor, timeout
        self.lost = False
        self.ref = None
        self.node: str | None = None  # the Ray node id, once the actor has started
        self.not_started: EnvFailure | None = None
        self._unsent: EnvFailure | None = None
        self._closing = None  # the close() sent beside a call past its deadline

    def start(self, cmd: str, arg: Any) -> None:
        self._unsent, self.ref, self._closing = self.not_started, None, None
        if self.not_started is not None:
            return
        try:
            self.ref = self.actor.call.remote(cmd, arg)
        except Exception as exc:  # noqa: BLE001 - e.g. a task row that cannot be pickled
            self._unsent = EnvFailure(f"{cmd}: could not send {type(arg).__name__} to the environment actor "
                                      f"({type(exc).__name__}: {exc})")

    def wait(self, deadline: float | None):
        if self._unsent is not None:
            return self._unsent
        ray = _ray()
        # A call that `RayRunner.wait_all` found past the deadline stays timed out, even if its result came since.
        timed_out = self._closing is not None or not ray.wait(
            [self.ref], timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))[0]
        if timed_out:
            self.close_then_kill()
            return EnvFailure(f"environment call timed out after {self.timeout}s (its environment was closed and "
                              "its actor killed)")
        try:
            return ray.get(self.ref)
        except ray.exceptions.RayActorError as exc:
            self.kill()
            return EnvFailure(f"environment actor died (its process or its node was lost): {_first_line(exc)}")
        except Exception as exc:  # noqa: BLE001 - a result that does not serialise or deserialise
            self.kill()
            return EnvFailure(f"the environment's result could not be read back from its actor "
                              f"({type(exc).__name__}: {_first_line(exc)}); keep StepResult.info to plain data")

    def finished(self) -> bool:
        if self._unsent is not None or self.ref is None:
            return True
        return bool(_ray().wait([self.ref], timeout=0)[0])

    def request_close(self) -> None:
        """Send `close()` to the actor's second thread, beside a call that may hang."""
        if self._closing is None:
            try:
                self._closing = self.actor.close.remote()
            except Exception:  # noqa: BLE001 - an actor that is gone already
                self._closing = False

    def close_then_kill(self) -> None:
        """Close the environment (up to CLOSE_TIMEOUT, unless `wait_all` waited already), then kill the actor."""
        self.request_close()
        if self._closing is not False:
            try:
                _ray().wait([self._closing], timeout=CLOSE_TIMEOUT)
            except Exception:  # noqa: BLE001 - an actor that is gone already
                pass
        self.kill()

    def kill(self) -> None:
        self.lost = True
        try:
            _ray().kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - an actor that is gone already
            pass


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class RayRunner(EnvRunner):
    """"ray": each slot's environment in a Ray actor; the pool's connection to Ray: creates the slots' actors, gathers
    a batch's results, stops what it started."""

    def __init__(self, factory: Callable, timeout: float | None, options: RunnerOptions):
        super().__init__(factory, timeout, options)
        self.placement = options.ray or RayPlacement()
        check_ray_placement("ray", self.placement)
        self._started_ray = False
        self._actor_class = None
        self._warned_capacity = False

    @classmethod
    def check_settings(cls, timeout: float | None, max_memory_mb: float | None) -> None:
        if max_memory_mb is not None:
            raise ValueError("env_max_memory_mb needs env_mode='process' (it measures worker processes on this "
                             "machine): under env_mode='ray' drop it, and give the actors Ray's memory through "
                             "env_ray_resources")

    def open(self, slots: list[int]) -> None:
        """Give each of `slots` without an actor a new one, and wait (once for all of them, up to
        `ACTOR_START_TIMEOUT`) until they run: an actor that cannot be placed or started fails its episode."""
        new = {slot: self.new_slot() for slot in slots if slot not in self.slots}
        if not new:
            return
        self._warn_if_over_capacity(len(self.slots) + len(new))
        ray = _ray()
        pings = {slot: handle.actor.node_id.remote() for slot, handle in new.items()}
        ready, _ = ray.wait(list(pings.values()), num_returns=len(pings), timeout=ACTOR_START_TIMEOUT)
        ready = set(ready)
        for slot, handle in new.items():
            try:
                if pings[slot] not in ready:
                    raise TimeoutError(f"not running after {ACTOR_START_TIMEOUT:.0f}s (does a node have the "
                                       f"resources it asks for: num_cpus={self.placement.num_cpus}, "
                                       f"resources={self.placement.resources}?)")
                handle.node = ray.get(pings[slot])
            except Exception as exc:  # noqa: BLE001 - e.g. the factory does not unpickle on that node
                handle.kill()
                handle.not_started = EnvFailure(f"environment actor did not start: {type(exc).__name__}: "
                                                f"{_first_line(exc)}")
            self.slots[slot] = handle

    def new_slot(self) -> _ActorSlot:
        self._connect()
        p = self.placement
        actor = self._actor_class.options(num_cpus=p.num_cpus, resources=dict(p.resources or {}),
                                          scheduling_strategy=p.scheduling, max_restarts=0,
                                          max_task_retries=0, max_concurrency=2).remote(self.factory)
        return _ActorSlot(actor, self.timeout)

    def wait_all(self, handles: list[SlotHandle], deadline: float | None) -> None:
        """Wait, once for the whole batch, until every submitted call has returned or the deadline has passed (each
        slot's `wait` then finds its result, or its timeout, at once)."""
        pending = {r.ref: r for r in handles if r.ref is not None}
        if not pending:
            return
        ray = _ray()
        _, late = ray.wait(list(pending), num_returns=len(pending),
                           timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        for ref in late:  # every late call's environment closes at once, not one CLOSE_TIMEOUT after another
            pending[ref].request_close()
        closing = [pending[ref]._closing for ref in late if pending[ref]._closing is not False]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT)

    def close(self) -> None:
        """Close every environment (CLOSE_TIMEOUT for all, beside any call that hangs), kill every actor, and shut Ray
        down if this pool started it."""
        actors, self.slots = list(self.slots.values()), {}
        if actors:
            ray = _ray()
            closing = [r.actor.close.remote() for r in actors]
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT)
            for r in actors:
                r.kill()
        if self._started_ray:
            _ray().shutdown()
            self._started_ray, self._actor_class = False, None

    def actor_nodes(self) -> dict[int, str]:
        return {slot: r.node for slot, r in self.slots.items() if r.node is not None}

    def _connect(self):
        ray = _ray()
        if not ray.is_initialized():
            address = self.placement.address
            local = address == "local" or (address is None and not os.environ.get("RAY_ADDRESS"))
            # A local cluster started for this pool needs no dashboard; its processes die with this one.
            ray.init(address=address, **({"include_dashboard": False} if local else {}))
            self._started_ray = True
            self._actor_class = None
        if self._actor_class is None:
            self._actor_class = ray.remote(_EnvActor)
        return ray

    def _warn_if_over_capacity(self, live: int) -> None:
        cpus = _ray().cluster_resources().get("CPU", 0.0)
        if not self._warned_capacity and self.placement.num_cpus * live > cpus:
            self._warned_capacity = True
            logger.warning("%d environment actors of env_ray_num_cpus=%s need more than the cluster's %s CPUs: the "
                           "actors that do not fit wait for a free CPU (and their calls count against env_timeout); "
                           "lower env_ray_num_cpus or add nodes", live, self.placement.num_cpus, cpus)
