"""Environments: the protocol and the adapters for TextWorld, ALFWorld and SWE-Gym.

The adapters import their engines lazily, so `import trl_multiturn.envs` works without the optional extras.
"""

from importlib import import_module

from .base import Environment, EnvironmentFactory, StepResult, TaskError
from .checker import EnvironmentCheckError, check_environment

_LAZY = {
    "TextWorldEnv": ".textworld",
    "ALFWorldEnv": ".alfworld",
    "SWEGymEnv": ".swegym",
}

__all__ = ["Environment", "EnvironmentCheckError", "EnvironmentFactory", "StepResult", "TaskError",
           "check_environment", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
