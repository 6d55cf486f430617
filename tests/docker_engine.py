"""The Docker engine of the tests, set up as the SWE-Gym README asks of one (once per machine, left running for later
runs, with its image cache), and the shipped tasks' images in it.

The engine is a `dockerd` of the tests' own (its own socket, data and run folders; a system engine already running
is left alone) with what the Docker sandbox needs beyond Docker's defaults:

- the `btrfs` storage driver, on a btrfs file system in a sparse image file behind a loop device with direct I/O: a
  container's files are a snapshot of the image's, inodes of their own, so the page cache, file locks and watches
  of one container's files are not another's, and a read misses the host's page cache the same way for everyone
  (not a cache below it, a VM's disk cache, which the sandbox's own residency makes irrelevant: `residency.py`);
  and `--storage-opt size` works (btrfs quota groups), the sandbox's disk quota;
- `--userns-remap=default`: a container's root is an unprivileged uid of the host (from /etc/subuid's `dockremap`);
- no bridge network or iptables rules (the sandbox's containers have no network).

`DOCKER_HOST` is set to its socket for the test process, so `DockerSandbox` and `docker.from_env()` reach it. The
base image is built on the first run on a machine (about two minutes); `TRL_MULTITURN_TEST_DOCKER_HOST` names another
engine to use instead. scripts/setup.sh installs docker.io, btrfs-progs and mmdebstrap.
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
STATE = Path("/var/lib/trl-multiturn-docker")  # the btrfs image, and where it is mounted (the engine's data)
RUN = Path("/run/trl-multiturn-docker")  # the engine's socket, pid file and run folder
SOCKET = f"unix://{RUN}/docker.sock"
IMAGE_GB = 64  # the sparse btrfs image's size: disk is taken as the engine writes


def _ping(base_url: str) -> docker.DockerClient | None:
    try:
        client = docker.DockerClient(base_url=base_url, timeout=120)
        client.ping()
        return client
    except docker.errors.DockerException:
        return None


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _btrfs_root() -> Path:
    """The engine's data folder, a mounted btrfs with quotas, made on first use."""
    root = STATE / "root"
    if os.path.ismount(root):
        return root
    image = STATE / "btrfs.img"
    root.mkdir(parents=True, exist_ok=True)
    if not image.exists():
        with open(image, "wb") as f:
            f.truncate(IMAGE_GB << 30)
        _run("mkfs.btrfs", "-q", str(image))
    loop = _run("losetup", "--find", "--show", "--direct-io=on", str(image))
    _run("mount", loop, str(root))
    _run("btrfs", "quota", "enable", str(root))
    return root


def _start_dockerd() -> docker.DockerClient:
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if os.geteuid() != 0 or not os.access(dockerd, os.X_OK) or shutil.which("mkfs.btrfs") is None:
        raise RuntimeError("no Docker engine of the tests answers, and it cannot be started here (it needs root, "
                           "docker.io and btrfs-progs: run scripts/setup.sh as root); or set "
                           "TRL_MULTITURN_TEST_DOCKER_HOST to an engine set up as the SWE-Gym README says")
    log = Path(tempfile.gettempdir()) / "trl-multiturn-dockerd.log"
    with open(Path(tempfile.gettempdir()) / "trl-multiturn-dockerd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter at a time; the others find it running
        client = _ping(SOCKET)
        if client is not None:
            return client
        root = _btrfs_root()
        RUN.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            subprocess.Popen([dockerd, "--storage-driver=btrfs", f"--data-root={root / 'docker'}",
                              f"--exec-root={RUN / 'exec'}", f"--pidfile={RUN / 'dockerd.pid'}", f"--host={SOCKET}",
                              "--userns-remap=default", "--bridge=none", "--iptables=false", "--ip6tables=false"],
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            client = _ping(SOCKET)
            if client is not None:
                return client
            time.sleep(0.5)
    raise RuntimeError(f"dockerd did not answer within 120 s; its log: {log}")


@functools.cache
def docker_client() -> docker.DockerClient:
    """A client of the tests' engine, which has every shipped task's image; DOCKER_HOST names it from now on."""
    chosen = os.environ.get("TRL_MULTITURN_TEST_DOCKER_HOST")
    client = _ping(chosen) if chosen else _ping(SOCKET) or _start_dockerd()
    if client is None:
        raise RuntimeError(f"TRL_MULTITURN_TEST_DOCKER_HOST={chosen}: no Docker engine answers there")
    os.environ["DOCKER_HOST"] = chosen or SOCKET
    images.ensure_base_image(client)
    for source in task_sources():
        images.ensure_task_image(client, source)
    return client


def sandbox_containers(client: docker.DockerClient) -> list:
    """Containers the SWE-Gym sandboxes (or image builds) made that still exist."""
    return client.containers.list(all=True, filters={"label": LABEL})


def remove_sandbox_containers(client: docker.DockerClient) -> None:
    for container in sandbox_containers(client):
        try:
            container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass  # removed meanwhile
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: its removal is already in progress
                raise
