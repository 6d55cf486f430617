"""Containers a driver created and never started, removed once the driver is gone.

A started sandbox container ends with its driver (`docker.KEEPER`: its PID 1 ends when the attached stdin closes,
and the engine removes it). A container between its create and its start has no such tie: every sandbox container
for a moment, the probe `DockerSandbox._create` learns the engine's masked paths from (created, inspected, removed,
never started), an image build's container (`images.ensure_task_image`). A driver killed (SIGKILL, or its machine's
OOM killer) in that window leaves the container, created, for good. So each one is labelled `DRIVER_LABEL` with its
driver's identity, and before each sandbox is created `reap` removes every created, never started container whose
driver is gone.

A driver's identity is `<boot id>/<PID namespace>/<pid>/<start time>`: the kernel's boot id
(`/proc/sys/kernel/random/boot_id`: this boot of this machine, the same in every container on it), the driver's PID
namespace (`/proc/self/ns/pid`, `pid:[inode]`: unique among the namespaces that exist; one reused after its namespace
ended names a driver gone with it, so judging it from the new namespace removes nothing wrongly), its pid there and its
start time in clock ticks after boot (`/proc/<pid>/stat`, field 22), so that a pid reused by a later process is another
driver. A reaper judges only the containers whose boot id and PID namespace are its own: its /proc then shows every
process of that namespace, and a driver is gone when no process has that pid and start time, or that process is a
zombie (it can start nothing). A container whose driver runs on another machine (a shared engine) or in another PID
namespace (another container; the host, seen from a container) is never removed here, since its driver cannot be seen
from here: the reapers there remove it. Nor is one an earlier boot left, whose machine cannot be told from another's:
`docker container prune --filter label=trl_multiturn.driver` removes those (every container so labelled that is not
running). A process whose /proc is not its own PID namespace's has no identity (''), and its containers are never
reaped.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

DRIVER_LABEL = "trl_multiturn.driver"
logger = logging.getLogger(__name__)


def _start(pid: int) -> str | None:
    """The start time of this namespace's process `pid` in clock ticks after boot; None if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]  # fields from the 3rd: the state, ..., the 22nd: start time


def _here() -> str | None:
    """`<boot id>/<PID namespace>` of this process; None where /proc is not its PID namespace's."""
    try:
        if int(Path("/proc/self/stat").read_text().split()[0]) != os.getpid():
            return None
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except (OSError, ValueError):
        return None


def driver_identity(pid: int | None = None) -> str:
    """The identity `DRIVER_LABEL` holds for the process `pid` of this PID namespace (default: this process); ''
    where it cannot be told."""
    pid = os.getpid() if pid is None else pid
    here, start = _here(), _start(pid)
    return f"{here}/{pid}/{start}" if here and start else ""


def driver_gone(identity: str) -> bool:
    """Whether the driver `identity` names is known to be gone: it is of this boot and this PID namespace, and no
    process has its pid and start time (or that process is a zombie). False where it cannot be told."""
    parts, here = identity.split("/"), _here()
    if len(parts) != 4 or not here or "/".join(parts[:2]) != here or not parts[2].isdigit():
        return False
    return _start(int(parts[2])) != parts[3]


def reap(api) -> list[str]:
    """Remove the containers of the engine `api` (a `docker.APIClient`) that are labelled `DRIVER_LABEL`, were
    created and never started, and whose driver is gone (`driver_gone`); returns their ids."""
    import docker

    removed = []
    for container in api.containers(all=True, filters={"label": DRIVER_LABEL, "status": "created"}):
        if not driver_gone((container.get("Labels") or {}).get(DRIVER_LABEL, "")):
            continue
        try:
            api.remove_container(container["Id"], force=True, v=True)  # and its /dev/pts volume
            removed.append(container["Id"])
        except docker.errors.NotFound:
            pass  # another reaper removed it first
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: another reaper's removal of it is under way
                logger.warning("could not remove the container %s its dead driver left: %s", container["Id"], e)
    if removed:
        logger.info("removed %d container(s) that dead drivers created and never started", len(removed))
    return removed
