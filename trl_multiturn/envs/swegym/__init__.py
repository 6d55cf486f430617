"""SWE-Gym: software-engineering episodes with real sandboxes, SWE-bench grading and an offline task set.

    from trl_multiturn.envs.swegym import SWEGymEnv, SWEGymConfig, load_tasks

    tasks = load_tasks()                       # the 12 shipped tasks, SWE-bench schema, as a datasets.Dataset
    env = SWEGymEnv(SWEGymConfig(reward="dense"))
    print(env.reset(tasks[0]))                 # the issue and the command reference
    result = env.step('<view path="intervals/core.py"/>')

The action format is documented in `actions.py`; sandboxes (bubblewrap locally, or Docker images) in
`sandbox/`; grading in `grading.py`, and what keeps the agent's patch from steering it in `integrity.py`.
"""

from .actions import COMMAND_REFERENCE, ActionParseError, format_action, parse_action
from .env import SWEGymConfig, SWEGymEnv
from .grading import Grade, grade_patch
from .sandbox import (
    CommandResult,
    DockerSandbox,
    LocalSandbox,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPathError,
    docker_image_name,
    make_sandbox,
)
from .tasks import load_tasks, task_rows

__all__ = [
    "COMMAND_REFERENCE",
    "ActionParseError",
    "CommandResult",
    "DockerSandbox",
    "Grade",
    "LocalSandbox",
    "SWEGymConfig",
    "SWEGymEnv",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxPathError",
    "docker_image_name",
    "format_action",
    "grade_patch",
    "load_tasks",
    "make_sandbox",
    "parse_action",
    "task_rows",
]
