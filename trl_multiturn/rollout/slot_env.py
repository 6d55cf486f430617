"""One episode slot's environment, as every execution mode of `EnvPool` (and each Ray actor) runs it: built on the
first reset, dropped after any failure, every result checked against the environment contract; a failure is an
`EnvFailure` value, never an exception."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..envs.base import ContractError, Environment, StepResult, checked_observation, checked_step_result


@dataclass
class EnvFailure:
    """An environment call that gave no valid result: an exception, a broken contract, a timeout or a lost worker."""

    reason: str


def _describe(cmd: str, exc: BaseException) -> str:
    if isinstance(exc, ContractError):
        return f"{cmd} broke the environment contract: {exc}"
    return f"{cmd} raised {type(exc).__name__}: {exc}"


class SlotEnvironment:
    """One slot's environment: built on the first reset, dropped (and closed) after any failure so that the slot's
    next reset builds a fresh one. Every result is checked against the environment contract."""

    def __init__(self, factory: Callable[[], Environment]):
        self.factory = factory
        self.env: Environment | None = None

    def call(self, cmd: str, arg: Any) -> str | StepResult | EnvFailure | None:
        try:
            if cmd == "reset":
                if self.env is None:
                    self.env = self.factory()
                return checked_observation(self.env.reset(arg), "the first observation")
            if self.env is None:
                return EnvFailure(f"{cmd} without a successful reset")
            if cmd == "step":
                return checked_step_result(self.env.step(arg))
            if cmd == "finish":
                result = self.env.finish()
                return None if result is None else checked_step_result(result)
            raise ValueError(f"unknown command {cmd!r}")
        except BaseException as exc:  # noqa: BLE001 - even SystemExit or KeyboardInterrupt raised by the
            self.close()  # environment's code fails its episode only (a user's Ctrl-C: env_pool._user_interrupts)
            return EnvFailure(_describe(cmd, exc))

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            try:
                env.close()
            except BaseException:  # noqa: BLE001 - closing a broken environment must not fail the run
                pass
