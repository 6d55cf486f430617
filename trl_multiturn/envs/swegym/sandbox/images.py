"""Docker images for the shipped tasks, built on this machine (no image registry needed).

    base   trl-multiturn/swegym-base:<recipe>     Debian 12 minbase from the Debian archive (mmdebstrap) with
                                                   python3, git and patch, plus the pinned test requirements
                                                   (pytest, from the package index)
    task   trl-multiturn/swegym-<name>:<commit>-<recipe>   the base plus the task's repository at /testbed

`<recipe>` hashes everything that goes into the base image, so an image is built once per machine and rebuilt
only when the recipe changes. Building the base takes about two minutes (downloads dominate) and needs root
(mmdebstrap's chroot mode) and `mmdebstrap`; a task image takes a second or two and is made on first use.

    python -m trl_multiturn.envs.swegym.sandbox.images          # build the base and every task image
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..tasks import shipped_repo, task_sources
from ..tasks.source import TaskSource, git
from .base import SandboxError
from .orphans import DRIVER_LABEL, driver_identity
from .pyenv import TEST_REQUIREMENTS

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python-is-python3", "git", "patch")
# Debian 12's python3 is 3.11; /usr/local/lib/python3.11/dist-packages is on its default sys.path.
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
PYTHON_VERSION = "3.11"
DPKG_EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*", "/usr/share/info/*")
RECIPE_VERSION = "1"
LABEL = "trl_multiturn.swegym"


def recipe_hash() -> str:
    """A hash of everything the base image is made of."""
    recipe = "\n".join([RECIPE_VERSION, SUITE, *PACKAGES, SITE_PACKAGES, PYTHON_VERSION, *DPKG_EXCLUDES,
                        *TEST_REQUIREMENTS])
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def base_image_name() -> str:
    return f"trl-multiturn/swegym-base:{recipe_hash()}"


def task_image_name(source: TaskSource) -> str:
    return f"trl-multiturn/swegym-{source.name}:{source.base_commit[:12]}-{recipe_hash()[:8]}"


def shipped_source(task: dict) -> TaskSource | None:
    """The shipped task a row is, or None for rows of other repositories."""
    return next((s for s in task_sources() if s.repo == task.get("repo") and s.base_commit == task.get("base_commit")),
                None)


def _exists(client, name: str) -> bool:
    import docker

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_base_image(client, mirror: str = MIRROR) -> str:
    """Build the base image (about two minutes) and return its name. Needs root and mmdebstrap."""
    name = base_image_name()
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None or os.geteuid() != 0:
        raise SandboxError(
            f"building {name} needs root and mmdebstrap (apt-get install mmdebstrap; scripts/setup.sh does so as "
            "root)"
        )
    with tempfile.TemporaryDirectory(prefix="swegym-image-") as tmp:
        site = Path(tmp) / "site"
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir",
               "--no-deps", "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--target", str(site),
               *TEST_REQUIREMENTS]
        rootfs = Path(tmp) / "rootfs.tar"
        hook = f'mkdir -p "$1{SITE_PACKAGES}" && cp -a {site}/. "$1{SITE_PACKAGES}/"'
        debootstrap = [mmdebstrap, "--quiet", "--mode=root", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                       *[f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES], f"--customize-hook={hook}",
                       SUITE, str(rootfs), mirror]
        for step in (pip, debootstrap):
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                raise SandboxError(f"building {name}: {' '.join(step[:3])} failed:\n{done.stderr[-3000:]}")
        repository, tag = name.split(":")
        client.api.import_image_from_file(str(rootfs), repository=repository, tag=tag,
                                          changes=["ENV LANG=C.UTF-8", f"LABEL {LABEL}=base"])
    if not _exists(client, name):
        raise SandboxError(f"docker import did not produce {name}")
    return name


def ensure_base_image(client) -> str:
    """The base image's name, building it first if this machine lacks it (one builder at a time)."""
    name = base_image_name()
    if _exists(client, name):
        return name
    with open(Path(tempfile.gettempdir()) / "trl_multiturn_swegym_image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return name if _exists(client, name) else build_base_image(client)


def _repo_tar(source: TaskSource) -> bytes:
    """The task's repository at its base commit, with its git history, as a tar of /testbed owned by root."""
    with tempfile.TemporaryDirectory(prefix="swegym-image-") as tmp:
        built = shipped_repo(source.repo, source.base_commit, Path(tmp) / "cache")
        checkout = Path(tmp) / "testbed"
        git(["clone", "-q", "--no-hardlinks", str(built), str(checkout)], tmp)
        git(["remote", "remove", "origin"], checkout)

        def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            return info

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(checkout, arcname="testbed", filter=as_root)
        return buf.getvalue()


def ensure_task_image(client, source: TaskSource, build_base: bool = False) -> str:
    """The shipped task's image, made from the base image on first use (a second or two).

    Raises `SandboxError` naming the build command when the base image is missing (unless `build_base`).
    """
    name = task_image_name(source)
    if _exists(client, name):
        return name
    base = base_image_name()
    if not _exists(client, base):
        if not build_base:
            raise SandboxError(f"the Docker image {base} is missing: build it once with "
                               "`python -m trl_multiturn.envs.swegym.sandbox.images` (root, about two minutes)")
        ensure_base_image(client)
    container = client.containers.create(base, command="true",
                                         labels={LABEL: "build", DRIVER_LABEL: driver_identity()})
    try:
        if not container.put_archive("/", _repo_tar(source)):
            raise SandboxError(f"could not copy {source.repo} into {name}")
        repository, tag = name.split(":")
        container.commit(repository=repository, tag=tag, changes=["WORKDIR /testbed", f"LABEL {LABEL}=task"])
    finally:
        container.remove(force=True)
    return name


def main() -> None:
    import docker

    client = docker.from_env()
    print(ensure_base_image(client))
    for source in task_sources():
        print(ensure_task_image(client, source))


if __name__ == "__main__":
    main()
