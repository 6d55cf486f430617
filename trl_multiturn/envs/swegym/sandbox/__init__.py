"""Where the agent's commands run: one `Sandbox` interface, a local (bubblewrap) and a Docker backend.

    base.py     the interface, `SandboxConfig`, errors
    local.py    `LocalSandbox`: a temporary checkout; each command under bubblewrap (bwrap.py) with the task
                Python (pyenv.py), never the trainer's
    docker.py   `DockerSandbox`: a fresh container of the task's image; images.py builds the shipped tasks' images;
                orphans.py removes the containers a dead driver created and never started
"""

from .base import (
    CHANNEL_FD,
    CommandResult,
    DiffError,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPathError,
    truncate_middle,
)
from .docker import DockerSandbox, docker_image_name, task_image
from .local import LocalSandbox


def make_sandbox(config: SandboxConfig) -> Sandbox:
    """The sandbox `config.sandbox` names."""
    return DockerSandbox(config) if config.sandbox == "docker" else LocalSandbox(config)


__all__ = [
    "CHANNEL_FD",
    "CommandResult",
    "DiffError",
    "DockerSandbox",
    "LocalSandbox",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxPathError",
    "docker_image_name",
    "make_sandbox",
    "task_image",
    "truncate_middle",
]
