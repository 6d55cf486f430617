"""Environments: the protocol and the adapters for TextWorld, ALFWorld, SWE-Gym and OpenEnv servers.

The adapters import their engines lazily, so `import trl_multiturn.envs` works without the optional extras.
"""

from ..lazy import lazy_getattr
from .base import Environment, EnvironmentFactory, StepResult, TaskError
from .checker import EnvironmentCheckError, check_environment

_LAZY = {
    "TextWorldEnv": ".textworld",
    "ALFWorldEnv": ".alfworld",
    "SWEGymEnv": ".swegym",
    "OpenEnvEnvironment": ".openenv",
}

__all__ = ["Environment", "EnvironmentCheckError", "EnvironmentFactory", "StepResult", "TaskError",
           "check_environment", *_LAZY]

__getattr__ = lazy_getattr(__name__, _LAZY)
