"""Where the agent's commands run: one `Sandbox` interface, a local and a Docker implementation.

`LocalSandbox` checks the task's repository out at `base_commit` in a fresh temporary folder and runs each
command as bash with a wall-clock timeout and CPU-time, memory, file-size and process-count limits. When the
trainer runs as root (as in most containers) each sandbox also gets a uid of its own, so the process limit (which
Linux counts per user) is per sandbox and the checkout is the only place its commands may write (besides
world-writable folders such as /tmp), and each command runs in a PID namespace of its own, so whatever it started
is killed and reaped when it returns. LocalSandbox is NOT a security boundary: it contains runaway commands (long
sleeps, fork floods, huge outputs, stray writes), not an adversary. Use `DockerSandbox` for untrusted code.

`DockerSandbox` starts the task's SWE-Gym / SWE-bench image (`xingyaoww/sweb.eval.x86_64.<instance id>`, with
the `__` of the id spelt `_s_` as Docker Hub requires) through the Docker SDK and runs the commands inside it.
"""

from __future__ import annotations

import ctypes
import fcntl
import io
import os
import posixpath
import pwd
import random
import resource
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base import TaskError
from .tasks import shipped_repo
from .tasks.source import git

SANDBOXES = ("local", "docker")


@dataclass
class SandboxConfig:
    """How and where the agent's commands run. Limits apply to every command and to the grading test run."""

    sandbox: str = field(default="local", metadata={"help": "Sandbox backend: 'local' (subprocesses) or 'docker'."})
    command_timeout: float = field(
        default=30.0, metadata={"help": "Wall-clock seconds a command may run before its processes are killed."}
    )
    cpu_seconds: int = field(default=60, metadata={"help": "CPU-time limit of each process (RLIMIT_CPU), seconds."})
    memory_mb: int = field(
        default=4096, metadata={"help": "Address-space limit of each process (RLIMIT_AS; Docker: memory), MiB."}
    )
    max_processes: int = field(
        default=128,
        metadata={"help": "Process-count limit (RLIMIT_NPROC per sandbox uid locally, pids_limit in Docker)."},
    )
    max_file_mb: int = field(
        default=64, metadata={"help": "Largest file a command may write, output included (RLIMIT_FSIZE), MiB."}
    )
    max_output_bytes: int = field(
        default=1_000_000,
        metadata={"help": "Bytes of a command's output read back (its head and tail); the middle is dropped."},
    )
    run_as_uid: str = field(
        default="auto",
        metadata={
            "help": "Local only. 'auto': when running as root, each sandbox runs its commands as a uid of its own "
            "taken from [uid_base, uid_base+uid_count); otherwise as the current user. 'none': never switch user. "
            "A number: that uid."
        },
    )
    uid_base: int = field(default=200_000, metadata={"help": "Local, as root: first uid handed to sandboxes."})
    uid_count: int = field(default=10_000, metadata={"help": "Local, as root: how many uids sandboxes may use."})
    keep_read_access: bool = field(
        default=True,
        metadata={
            "help": "Local, as root: let the sandbox uid read (never write) files only root can reach, through "
            "CAP_DAC_READ_SEARCH; needed when the Python interpreter lives under /root."
        },
    )
    pid_namespace: bool = field(
        default=True,
        metadata={
            "help": "Local, as root: run each command in a new PID namespace, so that everything it started is "
            "killed and reaped when it returns (no stray processes or zombies)."
        },
    )
    repos_dir: str | None = field(
        default=None,
        metadata={
            "help": "Local: folder of git clones named OWNER__NAME for task rows outside the shipped set "
            "(the shipped tasks are built on demand)."
        },
    )
    repo_cache_dir: str | None = field(
        default=None,
        metadata={"help": "Local: where shipped task repositories are built (default ~/.cache/trl_multiturn/swegym)."},
    )
    docker_image_template: str = field(
        default="xingyaoww/sweb.eval.x86_64.{instance_id}:latest",
        metadata={"help": "Docker image of a task; {instance_id} is the lower-cased id with '__' spelt as below."},
    )
    docker_dunder: str = field(
        default="_s_",
        metadata={"help": "How '__' in instance ids is spelt in image names ('_s_' SWE-Gym, '_1776_' SWE-bench)."},
    )
    docker_workdir: str = field(default="/testbed", metadata={"help": "Repository folder inside the image."})
    docker_user: str = field(default="root", metadata={"help": "User the commands run as inside the container."})
    docker_shell_init: str = field(
        default="source /opt/miniconda3/bin/activate testbed",
        metadata={"help": "Shell line run before every command in the container (activates the task's env)."},
    )
    docker_cpus: float = field(default=1.0, metadata={"help": "CPUs each container may use."})
    docker_network: bool = field(default=False, metadata={"help": "Give containers network access."})

    def __post_init__(self):
        if self.sandbox not in SANDBOXES:
            raise ValueError(f"sandbox={self.sandbox!r}: choose one of {SANDBOXES}")
        for name in ("command_timeout", "cpu_seconds", "memory_mb", "max_processes", "max_file_mb",
                     "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be positive")
        if self.run_as_uid not in ("auto", "none") and not str(self.run_as_uid).isdigit():
            raise ValueError(f"run_as_uid={self.run_as_uid!r}: use 'auto', 'none' or a numeric uid")


@dataclass
class CommandResult:
    """A finished command: its output (stdout and stderr interleaved), exit code and whether it timed out."""

    output: str
    exit_code: int
    timed_out: bool = False


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, lost its container): an infrastructure error, not the agent's."""


class DiffError(ValueError):
    """`git diff` failed in the checkout (e.g. the agent deleted .git): the agent's doing, graded as no patch."""


class SandboxPathError(ValueError):
    """A file path that leaves the repository checkout, or names no readable text file."""


def truncate_middle(text: str, budget: int) -> str:
    """`text` if it fits in `budget` characters, else its head and tail around a marker saying how much is gone."""
    if len(text) <= budget:
        return text
    head = budget // 2
    tail = budget - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters truncated ...]\n{text[len(text) - tail:]}"


class Sandbox(ABC):
    """A repository checkout at the task's base commit, and a shell in it.

    `start(task)` prepares the checkout; `run` executes one bash command in the repository root;
    `read_file` / `write_file` take paths relative to that root (or absolute ones inside it) and refuse any
    other; `write_scratch` stores a file outside the checkout (for patches) and returns its absolute path;
    `close` removes everything. Reusable as a context manager.
    """

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()

    workdir: str = ""

    @abstractmethod
    def start(self, task: dict) -> None: ...

    @abstractmethod
    def run(self, command: str, timeout: float | None = None) -> CommandResult: ...

    @abstractmethod
    def read_file(self, path: str) -> str: ...

    @abstractmethod
    def write_file(self, path: str, text: str) -> None: ...

    @abstractmethod
    def write_scratch(self, name: str, text: str) -> str: ...

    @abstractmethod
    def close(self) -> None: ...

    def diff(self, base_commit: str) -> str:
        """The checkout's changes against `base_commit` as a git diff, new files included, caches left out."""
        result = self.run(
            "git add -A -- . ':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/*.pyc' "
            "':(exclude,glob)**/.pytest_cache/**' >/dev/null 2>&1; "
            f"git -c core.fileMode=false diff --cached --no-color --binary {shlex.quote(base_commit)}",
            timeout=max(self.config.command_timeout, 60),
        )
        if result.exit_code != 0:
            raise DiffError(f"git diff failed in the checkout: {result.output[-2000:]}")
        return result.output

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_sandbox(config: SandboxConfig) -> Sandbox:
    """The sandbox `config.sandbox` names."""
    return DockerSandbox(config) if config.sandbox == "docker" else LocalSandbox(config)


# ----------------------------------------------------------------------------------------------------------------
# Local sandbox


_CLONE_NEWPID = 0x20000000
# The outer bash (in our PID namespace) runs the command in an inner bash, the new namespace's init. Its own
# stderr goes to /dev/null so that its "Killed" job notice does not land in the command's output.
_NAMESPACE_WRAPPER = 'exec 3>&2 2>/dev/null\n/bin/bash -c "$1" 2>&3 3>&-\nexit $?'

_CAP_DAC_READ_SEARCH = 2
_PR_SET_KEEPCAPS = 8
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_RAISE = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _Libc:
    """libc's prctl, capset and unshare, looked up in the parent: a forked child of a threaded process (a trainer)
    must not dlopen or dlsym, since another thread may have held the loader's lock at fork time."""

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self.prctl, self.capset, self.unshare = libc.prctl, libc.capset, libc.unshare


_libc: _Libc | None = None


def _get_libc() -> _Libc:
    global _libc
    if _libc is None:
        _libc = _Libc()
    return _libc


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_to_uid(uid: int, keep_read_access: bool, libc: _Libc) -> None:
    """Become `uid` (group `uid`, no supplementary groups), keeping CAP_DAC_READ_SEARCH across exec if asked.

    Runs in the forked child before exec. The capability goes into the ambient set so that bash and what it
    starts keep it; it lets them read and traverse any folder, never write.
    """
    if keep_read_access and libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if keep_read_access:
        bit = 1 << _CAP_DAC_READ_SEARCH
        data = (_CapData * 2)()
        data[0].effective = data[0].permitted = data[0].inheritable = bit
        if libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
        if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, _CAP_DAC_READ_SEARCH, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAP_AMBIENT_RAISE)")


def _live_pids(uid: int) -> list[int]:
    """Pids of `uid`'s processes that are not zombies."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            pids.append(int(entry.name))
    return pids


def _kill_all_of_uid(uid: int) -> None:
    """SIGKILL every process of `uid`: a child takes that uid and calls kill(-1), which spares only itself."""
    for _ in range(20):
        if not _live_pids(uid):
            return
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


class _UidLease:
    """An exclusive claim on one uid for the life of a sandbox: an flock that the kernel drops if we die."""

    def __init__(self, base: int, count: int):
        self._fd: int | None = None
        lock_dir = Path(tempfile.gettempdir()) / "trl_multiturn_sandbox_uids"
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        offset = random.randrange(count)
        for i in range(count):
            uid = base + (offset + i) % count
            try:
                pwd.getpwuid(uid)
                continue  # a real account: not ours to use
            except KeyError:
                pass
            fd = os.open(lock_dir / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise SandboxError(f"all {count} sandbox uids from {base} are in use: raise uid_count")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _chown_tree(root: Path, uid: int) -> None:
    os.lchown(root, uid, uid)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(folder, name), uid, uid)


class LocalSandbox(Sandbox):
    """The repository in a fresh temporary folder; each command a bash subprocess under resource limits.

    Layout: `<tmp>/repo` (the checkout, the commands' working folder, owned by the sandbox uid), `<tmp>/home`
    (their HOME and TMPDIR) and `<tmp>/scratch` (patches for grading). `<tmp>` itself is not writable by the
    sandbox uid, so writes next to the checkout fail.

    What holds where (see the README): as root with `run_as_uid='auto'`, the process limit counts this sandbox's
    processes only, writes outside the checkout fail except in world-writable folders (/tmp, /dev/shm), and every
    process a command leaves behind is killed when it returns. As an ordinary user, commands run as that user:
    the process limit counts all of the user's processes (it is set to what the user runs now plus
    `max_processes`), writes are limited by the user's own permissions only, and leftovers are killed only in the
    command's own process group.
    """

    def __init__(self, config: SandboxConfig | None = None):
        super().__init__(config)
        self._tmp: Path | None = None
        self._lease: _UidLease | None = None
        self._pid_namespace_ok = True
        self.uid: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self, task: dict) -> None:
        self.close()
        source = self._source_repo(task)
        self._tmp = Path(tempfile.mkdtemp(prefix="swegym-"))
        # removes the folder even if close() is never called (an exception unwinding the program, a lost object)
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
        try:
            self._tmp.chmod(0o711)
            checkout = self._tmp / "repo"
            git(["clone", "-q", "--no-hardlinks", "--no-checkout", str(source), str(checkout)], self._tmp)
            git(["-c", "advice.detachedHead=false", "checkout", "-q", task["base_commit"]], checkout)
            git(["remote", "remove", "origin"], checkout)
            for name in ("home", "scratch"):
                (self._tmp / name).mkdir(mode=0o755)
            self.uid = self._choose_uid()
            if self.uid is not None and self.uid != os.getuid():
                _kill_all_of_uid(self.uid)  # leftovers of an earlier holder that crashed
                _chown_tree(checkout, self.uid)
                _chown_tree(self._tmp / "home", self.uid)
            self.workdir = str(checkout)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._owns_uid:
            _kill_all_of_uid(self.uid)
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        self.uid = None
        if self._tmp is not None:
            self._cleanup()
            self._tmp = None
        self.workdir = ""

    def _source_repo(self, task: dict) -> Path:
        repo, base = task["repo"], task["base_commit"]
        built = shipped_repo(repo, base, self.config.repo_cache_dir)
        if built is not None:
            return built
        if self.config.repos_dir:
            candidate = Path(self.config.repos_dir) / repo.replace("/", "__")
            if (candidate / ".git").exists() or (candidate / "HEAD").exists():
                return candidate
        raise TaskError(
            f"repo={repo!r}: LocalSandbox has no clone of it. Put a git clone at "
            f"<repos_dir>/{repo.replace('/', '__')} and set repos_dir, or use sandbox='docker' for SWE-Gym images."
        )

    def _choose_uid(self) -> int | None:
        setting = str(self.config.run_as_uid)
        if setting == "none" or (setting == "auto" and os.geteuid() != 0):
            return None
        if setting == "auto":
            self._lease = _UidLease(self.config.uid_base, self.config.uid_count)
            return self._lease.uid
        if os.geteuid() != 0:
            raise SandboxError(f"run_as_uid={setting}: switching user needs root; use run_as_uid='auto' or 'none'")
        return int(setting)

    @property
    def _owns_uid(self) -> bool:
        return self.uid is not None and self.uid != os.getuid()

    # -- commands ----------------------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        home = str(self._tmp / "home")
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
        return {
            "PATH": path,
            "HOME": home,
            "TMPDIR": home,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "GIT_CONFIG_NOSYSTEM": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def _nproc_limit(self) -> int:
        if self._owns_uid:
            return self.config.max_processes
        mine = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == os.getuid())
        return mine + self.config.max_processes

    def _preexec(self, nproc: int, pid_namespace: bool):
        cfg, uid, keep = self.config, self.uid if self._owns_uid else None, self.config.keep_read_access
        libc = _get_libc()

        def limit() -> None:  # runs in the child, after fork and setsid, before exec
            mib = 1024 * 1024
            resource.setrlimit(resource.RLIMIT_CPU, (cfg.cpu_seconds, cfg.cpu_seconds + 1))
            resource.setrlimit(resource.RLIMIT_AS, (cfg.memory_mb * mib, cfg.memory_mb * mib))
            resource.setrlimit(resource.RLIMIT_FSIZE, (cfg.max_file_mb * mib, cfg.max_file_mb * mib))
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if pid_namespace and libc.unshare(_CLONE_NEWPID) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID)")
            if uid is not None:
                _drop_to_uid(uid, keep, libc)

        return limit

    def _spawn(self, command: str, out) -> tuple[subprocess.Popen, bool]:
        """Start `command`; returns the process and whether it runs in its own PID namespace.

        In a namespace the outer bash stays in ours and its child, the inner bash running the command, is the
        namespace's init: when that init exits or is killed, the kernel kills and reaps everything else in it.
        """
        use_ns = self._pid_namespace_ok and self._owns_uid and self.config.pid_namespace
        argv = ["/bin/bash", "-c", _NAMESPACE_WRAPPER, "swegym-sandbox", command] if use_ns else [
            "/bin/bash", "-c", command]
        try:
            proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
                preexec_fn=self._preexec(self._nproc_limit(), use_ns),
            )
        except OSError as e:
            if not use_ns or "unshare" not in str(e):
                raise
            self._pid_namespace_ok = False  # e.g. a container that forbids namespaces: fall back to sweeping
            return self._spawn(command, out)
        return proc, use_ns

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        if self._tmp is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        timeout = timeout or self.config.command_timeout
        with tempfile.TemporaryFile(dir=self._tmp / "scratch") as out:
            proc, in_namespace = self._spawn(command, out)
            timed_out = not _wait(proc, timeout)
            try:
                if timed_out and in_namespace:  # kill the namespace's init; the outer bash reaps it and exits
                    for child in _children(proc.pid):
                        _signal(child, signal.SIGKILL)
                    _wait(proc, 5)
            finally:
                _signal(-proc.pid, signal.SIGKILL)
                if self._owns_uid and not in_namespace:
                    _kill_all_of_uid(self.uid)
                proc.wait()
            code = proc.returncode
            return CommandResult(_read_capped(out, self.config.max_output_bytes), 128 - code if code < 0 else code,
                                 timed_out)

    # -- files -------------------------------------------------------------------------------------------------

    def _host_path(self, path: str) -> Path:
        if self._tmp is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        root = os.path.realpath(self.workdir)
        full = os.path.realpath(os.path.join(root, path))
        if full != root and not full.startswith(root + os.sep):
            raise SandboxPathError(f"{path}: outside the repository; give a path inside it")
        return Path(full)

    def read_file(self, path: str) -> str:
        host = self._host_path(path)
        if not host.is_file():
            raise SandboxPathError(f"{path}: no such file")
        if host.stat().st_size > self.config.max_file_mb * 1024 * 1024:
            raise SandboxPathError(f"{path}: larger than max_file_mb={self.config.max_file_mb}")
        data = host.read_bytes()
        if b"\0" in data[:8192]:
            raise SandboxPathError(f"{path}: a binary file")
        return data.decode("utf-8", errors="replace")

    def write_file(self, path: str, text: str) -> None:
        host = self._host_path(path)
        if host.is_dir():
            raise SandboxPathError(f"{path}: is a folder")
        missing = [p for p in [host.parent, *host.parent.parents] if not p.exists()]
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text(text, encoding="utf-8")
        if self._owns_uid:
            for p in [host, *missing]:
                os.lchown(p, self.uid, self.uid)

    def write_scratch(self, name: str, text: str) -> str:
        if self._tmp is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        path = self._tmp / "scratch" / Path(name).name
        path.write_text(text, encoding="utf-8")
        path.chmod(0o644)
        return str(path)


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `proc` to exit; True if it did. A pidfd wakes us the moment it exits
    (Popen.wait with a timeout polls, adding up to 50 ms to every command)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(fd)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _signal(pid: int, sig: int) -> None:
    """Send `sig` to `pid` (a negative pid: that process group), ignoring processes already gone."""
    try:
        if pid < 0:
            os.killpg(-pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _owner(proc_dir: Path) -> int | None:
    try:
        return proc_dir.stat().st_uid
    except OSError:
        return None


def _read_capped(f, cap: int) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    if size <= cap:
        return f.read().decode("utf-8", errors="replace")
    head = f.read(cap // 2).decode("utf-8", errors="replace")
    f.seek(size - cap // 2)
    tail = f.read().decode("utf-8", errors="replace")
    return f"{head}\n[... {size - 2 * (cap // 2)} bytes of output dropped ...]\n{tail}"


# ----------------------------------------------------------------------------------------------------------------
# Docker sandbox


def docker_image_name(instance_id: str, config: SandboxConfig | None = None) -> str:
    """The image SWE-Gym publishes for `instance_id`: `xingyaoww/sweb.eval.x86_64.<id>:latest`, lower-cased,
    with `__` spelt `_s_` (Docker Hub forbids double underscores), as OpenHands and the SWE-Gym release name them.
    """
    config = config or SandboxConfig()
    return config.docker_image_template.format(instance_id=instance_id.replace("__", config.docker_dunder).lower())


def task_image(task: dict, config: SandboxConfig | None = None) -> str:
    """The image a task row runs in: its `image_name` column, else SWE-Gym's image for its instance id."""
    return task.get("image_name") or docker_image_name(task["instance_id"], config)


class DockerSandbox(Sandbox):
    """The task's prebuilt image in a fresh container; commands through `docker exec` (the Docker SDK).

    The image already holds the repository at the base commit in `docker_workdir` and its environment. A row
    with an `image_name` column runs in that image instead of the derived name. `client` is a
    `docker.DockerClient` (default: `docker.from_env()`).
    """

    def __init__(self, config: SandboxConfig | None = None, client: Any = None):
        super().__init__(config)
        self._client = client
        self.container = None
        self.workdir = self.config.docker_workdir

    def image_for(self, task: dict) -> str:
        return task_image(task, self.config)

    def container_options(self, task: dict) -> dict[str, Any]:
        """Keyword arguments of `client.containers.run` for `task`."""
        cfg = self.config
        return {
            "image": self.image_for(task),
            "command": "tail -f /dev/null",
            "detach": True,
            "working_dir": cfg.docker_workdir,
            "user": cfg.docker_user,
            "mem_limit": f"{cfg.memory_mb}m",
            "pids_limit": cfg.max_processes,
            "nano_cpus": int(cfg.docker_cpus * 1e9),
            "network_disabled": not cfg.docker_network,
            "labels": {"trl_multiturn.swegym": task["instance_id"]},
        }

    def exec_command(self, command: str, timeout: float | None = None) -> list[str]:
        """The argv `docker exec` runs for `command`: the env's init line, CPU and file-size limits, a wall-clock
        `timeout` (exit code 124 when it fires) and the output cut to `max_output_bytes`."""
        cfg = self.config
        timeout = timeout or cfg.command_timeout
        inner = (
            f"{cfg.docker_shell_init} >/dev/null 2>&1; ulimit -t {cfg.cpu_seconds} -f {cfg.max_file_mb * 1024}; "
            f"cd {shlex.quote(cfg.docker_workdir)} && {command}"
        )
        outer = (
            f"timeout -k 5 {timeout:g} /bin/bash -c {shlex.quote(inner)} 2>&1 "
            f"| head -c {cfg.max_output_bytes}; exit ${{PIPESTATUS[0]}}"
        )
        return ["/bin/bash", "-c", outer]

    def start(self, task: dict) -> None:
        self.close()
        client = self._client
        if client is None:
            try:
                import docker
            except ImportError as e:
                raise SandboxError("sandbox='docker' needs the Docker SDK: pip install docker") from e
            client = self._client = docker.from_env()
        try:
            self.container = client.containers.run(**self.container_options(task))
        except Exception as e:
            raise SandboxError(f"could not start {self.image_for(task)}: {e}") from e

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        if self.container is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        result = self.container.exec_run(self.exec_command(command, timeout), workdir=self.config.docker_workdir,
                                         user=self.config.docker_user, demux=False)
        output = (result.output or b"").decode("utf-8", errors="replace")
        return CommandResult(output, result.exit_code, timed_out=result.exit_code == 124)

    def _container_path(self, path: str) -> str:
        root = self.config.docker_workdir.rstrip("/")
        full = posixpath.normpath(posixpath.join(root, path))
        if full != root and not full.startswith(root + "/"):
            raise SandboxPathError(f"{path}: outside the repository; give a path inside it")
        return full

    def read_file(self, path: str) -> str:
        full = self._container_path(path)
        result = self.run(f"test -f {shlex.quote(full)} && cat -- {shlex.quote(full)}")
        if result.exit_code != 0:
            raise SandboxPathError(f"{path}: no such file")
        return result.output

    def _put(self, full: str, text: str) -> None:
        data = text.encode("utf-8")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(full))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        folder = posixpath.dirname(full)
        self.run(f"mkdir -p {shlex.quote(folder)}")
        if not self.container.put_archive(folder, buf.getvalue()):
            raise SandboxError(f"could not write {full} into the container")

    def write_file(self, path: str, text: str) -> None:
        self._put(self._container_path(path), text)

    def write_scratch(self, name: str, text: str) -> str:
        full = posixpath.join("/tmp/swegym", posixpath.basename(name))
        self._put(full, text)
        return full

    def close(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:
                pass  # already gone; nothing else to release
            self.container = None
