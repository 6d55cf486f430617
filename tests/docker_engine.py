"""A Docker engine and the shipped tasks' images for the tests: once per test process.

The engine already running is used; otherwise, as root, `dockerd` is started here (without its bridge network
or iptables rules: the sandbox's containers have no network) and left running for later runs, with its image
cache. The base image is built on the first run on a machine (about two minutes) and found by its recipe hash
afterwards. scripts/setup.sh installs docker.io and mmdebstrap.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import docker

from trl_multiturn.envs.swegym.sandbox import images
from trl_multiturn.envs.swegym.tasks import task_sources

LABEL = "trl_multiturn.swegym"


def _ping() -> docker.DockerClient | None:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
        return client
    except docker.errors.DockerException:
        return None


def _start_dockerd() -> docker.DockerClient:
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if os.geteuid() != 0 or not os.access(dockerd, os.X_OK):
        raise RuntimeError("no Docker engine answers, and dockerd cannot be started here (it needs root and the "
                           "docker.io package: run scripts/setup.sh as root), or set DOCKER_HOST")
    log = Path(tempfile.gettempdir()) / "trl-multiturn-dockerd.log"
    with open(Path(tempfile.gettempdir()) / "trl-multiturn-dockerd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter at a time; the others find it running
        client = _ping()
        if client is not None:
            return client
        with open(log, "ab") as out:
            subprocess.Popen([dockerd, "--bridge=none", "--iptables=false", "--ip6tables=false"], stdout=out,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            client = _ping()
            if client is not None:
                return client
            time.sleep(0.5)
    raise RuntimeError(f"dockerd did not answer within 120 s; its log: {log}")


@functools.cache
def docker_client() -> docker.DockerClient:
    """A client of a running engine that has every shipped task's image."""
    client = _ping() or _start_dockerd()
    images.ensure_base_image(client)
    for source in task_sources():
        images.ensure_task_image(client, source)
    return client


def sandbox_containers(client: docker.DockerClient) -> list:
    """Containers the SWE-Gym sandboxes (or image builds) made that still exist."""
    return client.containers.list(all=True, filters={"label": LABEL})


def remove_sandbox_containers(client: docker.DockerClient) -> None:
    for container in sandbox_containers(client):
        container.remove(force=True)
