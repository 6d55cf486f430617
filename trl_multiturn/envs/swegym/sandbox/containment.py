"""Limits on a local sandbox as a whole, beyond the per-process rlimits: a disk quota for its writable folders (a
size-limited tmpfs in a mount namespace of the sandbox's own, never mounted on the host) and a memory limit for all
its processes together (a cgroup). Both need root and a kernel that offers them; where one is missing the sandbox
says so once, in the log, and keeps the per-process limits only (see the SWE-Gym README's containment section)."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import uuid
from pathlib import Path

from .base import SandboxError
from .bwrap import find_program

logger = logging.getLogger(__name__)
_warned: set[str] = set()
CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "trl_multiturn_sandboxes"


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


# Empty on the host, shared by every sandbox; its parents must be open to every uid (bubblewrap, as the sandbox uid,
# binds from below it), so not under TMPDIR, which may be private.
MOUNT_POINT = Path("/run/trl_multiturn_sandbox")
ROOT_COPY = MOUNT_POINT / "root"  # where a PrivateSpace holds its copy of the sandbox root
PTYS_FOLDER = MOUNT_POINT / "pts"  # where a PrivateSpace holds its devpts instance
# The pseudo-terminals one local sandbox may hold at once (its devpts instance's `max`): tests that drive a program
# through a pty (`pty`, `pexpect`) use one or two each. Without a cap of its own a sandbox could take the machine's
# whole pool (`/proc/sys/kernel/pty/max` less the host's reserve: 3,071 here), and no concurrent sandbox could open
# one.
MAX_PTYS = 64
# A devpts instance of a sandbox's own (both backends mount one at /dev/pts): at most MAX_PTYS ptys, /dev/ptmx open
# to every user (bubblewrap and the engine link /dev/ptmx to pts/ptmx), each pty its opener's, as the kernel's default
DEVPTS_OPTIONS = f"newinstance,max={MAX_PTYS},ptmxmode=0666,mode=0620"
# In a mount namespace of its own: the quota tmpfs on MOUNT_POINT ($0) of $1 MiB; a devpts instance with the options
# $3 at $0/pts (the sandbox's /dev/pts); a copy of the root $2 (if not empty) on a tmpfs of its own at $0/root,
# read-only once copied; then it prints its pid and waits for a line.
_HOLDER = ('mount -t tmpfs -o "size=$1m,mode=0711,nosuid,nodev" trl-multiturn-sandbox "$0" && mkdir "$0/pts" && '
           'mount -t devpts -o "$3" trl-multiturn-pts "$0/pts" && '
           'if [ -n "$2" ]; then mkdir "$0/root" && '
           'mount -t tmpfs -o mode=0755,nosuid,nodev trl-multiturn-root "$0/root" && cp -a "$2/." "$0/root/" && '
           'mount -o remount,ro "$0/root" || exit 1; fi && echo $$ && read _')


class PrivateSpace:
    """A sandbox's writable space that nothing outside the sandbox's own namespaces holds.

    As root: a tmpfs of `disk_mb` MiB (the disk quota; what it holds counts against the memory cgroup, never the
    host disk) mounted in a mount namespace of its own. The host never sees the mount: this process keeps the
    namespace by descriptor (`mnt_fd`) and reaches the tmpfs through `root` (/proc/self/fd/N), so when it ends,
    however it ends (SIGKILL included), the kernel drops the namespace and the tmpfs with its files. Commands and
    git run in that mount namespace (through nsenter, `enter_argv()`); `MOUNT_POINT`, the same empty folder for
    every sandbox, is where they see the tmpfs; `PTYS_FOLDER`, a devpts instance of its own that holds `MAX_PTYS`
    at most, is the sandbox's /dev/pts (bubblewrap's own has no cap). `sandbox_root` (`rootfs.ensure_root`), if
    given, is copied to a tmpfs of its own at `ROOT_COPY`, outside the quota (its pages count against this process's
    memory, not the sandbox's), and made read-only; it goes with the namespace like the rest.
    """

    def __init__(self, megabytes: int, sandbox_root: Path | None = None):
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _HOLDER, str(MOUNT_POINT),
             str(megabytes), str(sandbox_root or ""), DEVPTS_OPTIONS],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        fds: list[int] = []
        try:
            line = holder.stdout.readline().strip()
            if not line.isdigit():
                holder.stdin.close()
                raise SandboxError(f"could not make the sandbox's private tmpfs: {holder.stderr.read().strip()}")
            proc = Path("/proc", line)
            for name in ("ns/mnt", f"root{MOUNT_POINT}"):
                fds.append(os.open(proc / name, os.O_RDONLY | os.O_CLOEXEC))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        finally:
            if not holder.stdin.closed:
                holder.stdin.close()  # the holder ends; its namespaces live on in our descriptors
            holder.wait()
            holder.stdout.close()
            holder.stderr.close()
        self.mnt_fd, self.root_fd = fds
        self._identity = [_identity(fd) for fd in fds]
        self.root = Path(f"/proc/self/fd/{self.root_fd}")

    def check(self) -> None:
        """Before a child is started to enter the space: its descriptors are still the ones this space opened. Other
        code of this process that closes a descriptor twice may close one of them, and the number may then name
        another file; a SandboxError says so rather than a setns that fails, or enters something else."""
        for fd, identity in zip((self.mnt_fd, self.root_fd), self._identity):
            try:
                same = _identity(fd) == identity
            except OSError:
                same = False
            if not same:
                raise SandboxError(f"the sandbox's private space lost its descriptor {fd}: other code of this process "
                                   "closed it (a descriptor closed twice); this sandbox cannot run commands")

    def enter_argv(self, workdir: str | None = None) -> list[str]:
        """The start of a command line that runs the rest in the private mount namespace (in `workdir` there):
        nsenter, a fresh single-threaded process, joins it. Not a `preexec_fn`: the kernel refuses a mount namespace
        to a process that shares its file-system state with another thread (EINVAL), and the Python child of a
        `preexec_fn` runs the at-fork handlers of every library loaded, some of which start a thread (CI met it). The
        namespace is named by this process's descriptor (/proc/PID/fd/N, root may open it), so no child inherits it."""
        self.check()
        wd = [f"--wdns={workdir}"] if workdir else []
        return [_program("nsenter"), f"--mount=/proc/{os.getpid()}/fd/{self.mnt_fd}", *wd, "--"]

    def close(self) -> None:
        for fd in (self.mnt_fd, self.root_fd):
            os.close(fd)


def _identity(fd: int) -> tuple[int, int]:
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino


def reporting_child(setup):
    """`setup` as a `preexec_fn` whose failure reaches the caller with its reason: subprocess reports any exception
    in a `preexec_fn` as "Exception occurred in preexec_fn" alone, so this writes the exception to the child's stderr
    and exits with `CHILD_SETUP_FAILED` (the command, bubblewrap included, never ran)."""

    def run() -> None:
        try:
            setup()
        except BaseException as e:  # noqa: BLE001 - the child must never return to the caller's code
            os.write(2, f"the sandbox's child could not be set up: {type(e).__name__}: {e}\n".encode())
            os._exit(CHILD_SETUP_FAILED)

    return run


CHILD_SETUP_FAILED = 126


def guard_argv(parent: int, uid: int | None) -> list[str]:
    """The start of a command line that runs the rest as `uid` (if given; with no supplementary groups), killed
    when the thread that started it ends, and not at all if `parent` is gone already: setpriv sets the uid, then the
    parent-death signal (which a uid change clears), and sh checks the parent before it execs the rest (a parent
    killed before the signal was set). bubblewrap's own `--die-with-parent` comes only once it runs."""
    as_uid = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    return [_program("setpriv"), *as_uid, "--pdeathsig=KILL", "--",
            "/bin/sh", "-c", 'test "$PPID" = "$0" && exec "$@"; exit 125', str(parent)]


@functools.cache
def _program(name: str) -> str:
    """A util-linux program every local command runs through, looked up once."""
    return find_program(name, "util-linux, which the sandbox's commands run through")


def private_space(megabytes: int, sandbox_root: Path | None = None) -> PrivateSpace | None:
    """A `PrivateSpace` as root where the kernel lets root mount; None otherwise (logged once: the sandbox's folders
    are then a plain temporary folder without quota, removed on close, on SIGINT and on SIGTERM, not on SIGKILL)."""
    why = "not root"
    if os.geteuid() == 0:
        try:
            MOUNT_POINT.mkdir(mode=0o755, parents=True, exist_ok=True)
            return PrivateSpace(megabytes, sandbox_root)
        except (OSError, SandboxError) as e:
            why = str(e)
    warn_once("quota", f"sandbox disk quota: {why}, so the sandbox folders are a plain temporary folder, not "
              "size-limited (only each file is, by max_file_mb); see the SWE-Gym README, 'Containment'")
    return None


def _memory_hierarchy() -> tuple[Path, str] | None:
    """The folder of the memory cgroup hierarchy and its limit file: cgroup v2 (memory.max) or v1 (memory)."""
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return CGROUP_ROOT, "memory.max"
    if (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists():
        return CGROUP_ROOT / "memory", "memory.limit_in_bytes"
    return None


class MemoryCgroup:
    """A cgroup of its own whose memory limit holds for all the processes of one sandbox together (tmpfs pages
    they write count too); the kernel's OOM killer ends a process of that cgroup that goes past it."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, megabytes: int) -> MemoryCgroup | None:
        """A fresh cgroup limited to `megabytes` MiB, or None (logged once) where none can be made."""
        hierarchy = _memory_hierarchy()
        try:
            if hierarchy is None:
                raise OSError("no memory cgroup controller under /sys/fs/cgroup")
            root, limit_file = hierarchy
            parent = root / GROUP
            parent.mkdir(exist_ok=True)
            remove_orphans(parent)
            if limit_file == "memory.max":  # v2: the controller must be enabled for the children of each level
                for level in (root, parent):
                    (level / "cgroup.subtree_control").write_text("+memory")
            path = parent / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
            path.mkdir()
            (path / limit_file).write_text(str(megabytes * 1024 * 1024))
            return cls(path)
        except OSError as e:
            warn_once("cgroup", f"sandbox memory limit: no cgroup could be made ({e}); each process keeps its own "
                      "limits (memory_mb, max_processes) but their total is not bounded; see the SWE-Gym README, "
                      "'Containment'")
            return None

    @classmethod
    def of_container(cls, container_id: str) -> MemoryCgroup | None:
        """The memory cgroup a Docker engine on this machine made for a container (cgroupfs or systemd driver,
        v1 or v2), or None where none is found (a remote engine)."""
        hierarchy = _memory_hierarchy()
        if hierarchy is None:
            return None
        root = hierarchy[0]
        for path in (root / "docker" / container_id, root / "system.slice" / f"docker-{container_id}.scope"):
            if path.is_dir():
                return cls(path)
        return None

    def oom_counts(self) -> tuple[int, int]:
        """(processes of this group the OOM killer has ended, whatever ran out: the group or the machine; times
        the group reached its own limit), the kernel's counters: v2 memory.events' `oom_kill` and `oom`; v1
        memory.oom_control's `oom_kill` and memory.failcnt. (0, 0) where they cannot be read (the group gone)."""
        try:
            if (self.path / "memory.events").exists():
                events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", 0)), int(events.get("oom", 0))
            control = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
            return int(control.get("oom_kill", 0)), int((self.path / "memory.failcnt").read_text())
        except (OSError, ValueError):
            return 0, 0

    def enter(self) -> None:
        """Move the calling process into the cgroup; run in the child before exec, so everything it starts is in."""
        join_cgroup(self.path)

    def remove(self) -> None:
        """Remove the cgroup (empty once its commands have ended)."""
        try:
            self.path.rmdir()
        except OSError:
            pass  # a process not yet reaped still holds it; an empty leftover folder costs nothing


def machine_oom_kills() -> int:
    """Processes the kernel's OOM killer has ended on this machine since it started (/proc/vmstat `oom_kill`)."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            key, value = line.split()
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


class OomWatch:
    """Tells, once a command has ended, why a process of it was OOM-killed, if one was: the sandbox reached its own
    memory limit (the code under test's doing: graded like any crash) or the machine ran out of memory (an
    infrastructure failure: SandboxError, never a result). Started before the command; `cgroup` is the sandbox's
    memory cgroup (None: only the machine's counter is watched)."""

    def __init__(self, cgroup: MemoryCgroup | None):
        self.cgroup = cgroup
        self._group = cgroup.oom_counts() if cgroup is not None else (0, 0)
        self._machine = machine_oom_kills()

    def verdict(self, killed: bool) -> str | None:
        """'limit' when a process of the group was killed and the group reached its limit meanwhile; 'machine' when
        the machine's OOM killer ended something while the command ran and the kernel counted an OOM kill of a
        process of the group (its counter counts every OOM killer's kills) without the group reaching its limit;
        None otherwise. How the command ended is no evidence: its code can end its own shell by SIGKILL (137) at a
        moment another sandbox is OOM-killed, so only the group's counter says an OOM kill was ours. Without a
        group (`cgroup` None) the machine's counter and `killed` (the command ended by SIGKILL, or with its shell's
        137) are all there is: such a kill while any process of the machine was OOM-killed is called the machine's
        (the episode fails, no reward is made up; docs in the SWE-Gym README)."""
        kills, hits = self.cgroup.oom_counts() if self.cgroup is not None else (0, 0)
        if kills > self._group[0] and hits > self._group[1]:
            return "limit"
        ours = kills > self._group[0] if self.cgroup is not None else killed
        if machine_oom_kills() > self._machine and ours:
            return "machine"
        return None


def join_cgroup(path: Path) -> None:
    """Move the calling process into the cgroup at `path` (a child, before exec: everything it starts is in)."""
    fd = os.open(path / "cgroup.procs", os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def remove_orphans(parent: Path) -> None:
    """End what is left in the cgroups of sandboxes whose process is gone (killed before it could remove them; a
    process that missed its parent-death signal) and remove those cgroups once empty."""
    for group in parent.iterdir():
        pid = group.name.split("-")[0]
        if group.is_dir() and pid.isdigit() and not Path("/proc", pid).exists():
            try:
                for left in (group / "cgroup.procs").read_text().split():
                    os.kill(int(left), signal.SIGKILL)
                group.rmdir()
            except OSError:
                pass  # not yet reaped: the next sandbox removes it
