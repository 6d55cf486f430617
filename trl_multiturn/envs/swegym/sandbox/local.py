"""`LocalSandbox`: the task's repository in a fresh temporary folder, each command confined by bubblewrap.

Layout: `<space>/repo` (the checkout, `workdir` = /testbed inside) and `<space>/tmp` (the sandbox's own /tmp,
where the scratch folder /tmp/swegym lives), both owned by the sandbox uid; `<space>` itself belongs to the trainer.
The files commands run on are a private copy of a minimal root (`rootfs.py`): as root on a tmpfs of its own beside
the space (`containment.ROOT_COPY`), otherwise at `<space>/root`.
As root `<space>` is a tmpfs that only the sandbox's own mount namespace has (`containment.PrivateSpace`: no host
mount, no host folder, gone with this process however it ends); otherwise a fresh temporary folder. What a command
sees and what it cannot do is listed in `bwrap.py`, `seccomp.py` and the SWE-Gym README.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import random
import resource
import select
import shutil
import signal
import site
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from ...base import TaskError
from ..tasks import default_cache_dir, shipped_repo
from ..tasks.source import git_env
from .base import (
    CHANNEL_FD,
    OOM_SCORE_ADJ,
    TIMEOUT_EXIT_CODE,
    CommandResult,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPathError,
    exit_on_sigterm,
    out_of_memory_note,
    timeout_note,
)
from .bwrap import bwrap_argv
from .containment import (
    MOUNT_POINT,
    PTYS_FOLDER,
    ROOT_COPY,
    MemoryCgroup,
    OomWatch,
    PrivateSpace,
    guard_argv,
    private_space,
    reporting_child,
    warn_once,
)
from .cpus import CpuLease, CpusetCgroup
from .hostfiles import open_folder, read_regular, write_regular
from .procview import write_views
from .pyenv import ensure_task_python
from .rootfs import copy_root, ensure_root
from .seccomp import seccomp_program


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


def trainer_folders() -> list[Path]:
    """Folders of the trainer's own Python that a sandbox must not read: trl_multiturn (the task set and its
    answers) and every site-packages of this interpreter and of its base installation."""
    folders = {Path(__file__).resolve().parents[3]}  # trl_multiturn/
    folders.update(Path(p) for p in site.getsitepackages())
    if site.ENABLE_USER_SITE:
        folders.add(Path(site.getusersitepackages()))
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    folders.update(Path(sysconfig.get_path(name, vars=base)) for name in ("purelib", "platlib"))
    return sorted({p.resolve() for p in folders})


class LocalSandbox(Sandbox):
    """The repository in a fresh temporary folder; each command bash under bubblewrap and resource limits.

    With `isolation='bwrap'` (the default) each command runs in new user, network, PID, IPC, UTS, cgroup and mount
    namespaces under a seccomp filter, seeing only its private copy of a minimal root (/usr, /etc, the task Python:
    `rootfs.py`), the checkout (at `/testbed`) and the sandbox's own /tmp; as root it also runs as a uid of its
    own. Every process a command starts ends with it. With `isolation='none'` commands are plain subprocesses with
    resource limits, as the trainer's user, in the host folders. See the SWE-Gym README for what each holds.
    """

    def __init__(self, config: SandboxConfig | None = None):
        super().__init__(config)
        self._tmp: Path | None = None  # the space as this process reaches it
        self._space: PrivateSpace | None = None
        self._lease: _UidLease | None = None
        self._prefix: list[str] = []
        self._cgroup: MemoryCgroup | None = None
        self._cpu_lease: CpuLease | None = None
        self._cpuset: CpusetCgroup | None = None
        self.uid: int | None = None
        self.cpus: tuple[int, ...] | None = None  # the CPUs its commands run on, its own (`cpus.py`); None: shared

    @property
    def isolated(self) -> bool:
        return self.config.isolation == "bwrap"

    @property
    def host_workdir(self) -> Path:
        """The checkout's folder on the host (`workdir` is where commands see it)."""
        if self._tmp is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        return self._tmp / "repo"

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self, task: dict) -> None:
        self.close()
        exit_on_sigterm()
        source = self._source_repo(task)
        try:
            python = Path(self.config.task_python or ensure_task_python(self._cache_dir())).absolute()
            if not (python / "bin" / "python").exists():
                raise SandboxError(f"task_python={str(python)!r} has no bin/python: give a virtual environment")
            python_dirs = list(dict.fromkeys([python, Path(sys.base_prefix).resolve()]))
            hidden = trainer_folders()
            # the files commands run on: a private copy of a minimal root (`rootfs.py`), not the host's
            root = (ensure_root(self._cache_dir(), python_dirs, hidden, tuple(self.config.root_extra))
                    if self.isolated else None)
            self.uid = self._choose_uid()
            if self.config.sandbox_cpus:  # waits for them here, before any command's time limit starts
                self._cpu_lease = CpuLease(self.config.sandbox_cpus, self.config.cpu_wait)
                self.cpus = self._cpu_lease.cpus
            self._space = private_space(self.config.disk_mb, root)
            if self._space is not None:
                self._tmp, inside = self._space.root, MOUNT_POINT  # as this process / as commands reach it
                root_copy = ROOT_COPY if root else None
            else:
                self._tmp = inside = Path(tempfile.mkdtemp(prefix="swegym-"))
                root_copy = inside / "root" if root else None
            self._cgroup = MemoryCgroup.create(self.config.total_memory_mb)
            self._cpuset = _cpuset(self.cpus, self._cgroup)
            # releases everything even if close() is never called (an exception unwinding the program, a lost object)
            self._cleanup = weakref.finalize(self, _remove, self._space, self._tmp, self._cgroup, self._cpuset)
            self._tmp.chmod(0o711)
            if root is not None and self._space is None:
                copy_root(root, root_copy)
            checkout, own_tmp = inside / "repo", inside / "tmp"
            self._git(["clone", "-q", "--no-hardlinks", "--no-checkout", str(source), str(checkout)])
            self._git(["-C", str(checkout), "-c", "advice.detachedHead=false", "checkout", "-q", task["base_commit"]])
            self._git(["-C", str(checkout), "remote", "remove", "origin"])
            (self._tmp / "tmp" / "swegym").mkdir(parents=True)
            (self._tmp / "tmp").chmod(0o700)
            if self.uid is not None and self.uid != os.getuid():
                _chown_tree(self._tmp / "repo", self.uid)
                _chown_tree(self._tmp / "tmp", self.uid)
            if self.isolated:
                self.workdir, self.scratch_dir = "/testbed", "/tmp/swegym"
                views = write_views(self._tmp / "proc", self.config.total_memory_mb)
                self._prefix = bwrap_argv(
                    checkout=str(checkout), tmp=str(own_tmp), workdir=self.workdir,
                    python_dirs={folder: root_copy / folder.relative_to("/") for folder in python_dirs},
                    hidden=hidden, root=str(root_copy),
                    env=self._env(python, home="/tmp"), shm_bytes=self.config.max_file_mb * 1024 * 1024,
                    proc_views={target: str(inside / "proc" / source.name) for target, source in views.items()},
                    pts=str(PTYS_FOLDER) if self._space is not None else None,
                )
                self._probe()
            else:
                self.workdir, self.scratch_dir = str(checkout), str(own_tmp / "swegym")
                self._prefix = []
                self._plain_env = self._env(python, home=str(own_tmp))
        except BaseException:
            self.close()
            raise

    def _git(self, args: list[str]) -> None:
        """Run git in the sandbox's mount namespace (where its space is), as the trainer."""
        enter = self._space.enter_argv() if self._space is not None else []
        done = subprocess.run([*enter, "git", *args], env=git_env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise SandboxError(f"git {' '.join(args)} failed: {done.stderr.strip()}")

    def _probe(self) -> None:
        """Fail at start, with bubblewrap's own words, where it cannot make its namespaces."""
        try:
            self.run("true", timeout=30)
        except SandboxError as e:
            raise SandboxError(
                f"{e}\nNot root: unprivileged user namespaces must be allowed (sysctl "
                "kernel.unprivileged_userns_clone=1, or run as root); or set isolation='none' (see the SWE-Gym README)"
            ) from None

    def _cache_dir(self) -> Path:
        return Path(self.config.repo_cache_dir) if self.config.repo_cache_dir else default_cache_dir()

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        self.uid = None
        if self._tmp is not None:
            self._cleanup()
            self._tmp, self._space, self._cgroup, self._cpuset = None, None, None, None
        if self._cpu_lease is not None:  # after the cleanup: its commands have ended
            self._cpu_lease.release()
            self._cpu_lease, self.cpus = None, None
        self.workdir, self._prefix = "", []

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
        if not self.isolated or setting == "none" or os.geteuid() != 0:
            return None
        if setting == "auto":
            self._lease = _UidLease(self.config.uid_base, self.config.uid_count)
            return self._lease.uid
        return int(setting)

    # -- commands ----------------------------------------------------------------------------------------------

    @staticmethod
    def _env(python: Path, home: str) -> dict[str, str]:
        return {
            "PATH": f"{python / 'bin'}:/usr/local/bin:/usr/bin:/bin",
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
        if self.uid is not None:
            return self.config.max_processes
        me = os.getuid()
        mine = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == me)
        return mine + self.config.max_processes

    def _child(self) -> tuple[list[str], Callable[[], None]]:
        """How a command's process is set up: the programs it is exec'd through (into the private space, as the
        sandbox uid, killed with its parent: `containment`), and a `preexec_fn` for what a forked child of this
        process does safely (its cgroup, its rlimits: nothing the kernel refuses to a copy of a threaded process)."""
        cfg, nproc, mib, cgroup = self.config, self._nproc_limit(), 1024 * 1024, self._cgroup
        cpuset, cpus = self._cpuset, self.cpus
        plain_workdir = self.workdir if not self.isolated else None
        uid = self.uid if self.uid is not None and self.uid != os.getuid() else None
        enter = self._space.enter_argv(plain_workdir) if self._space is not None else []

        def limit() -> None:  # runs in the child, after fork and setsid, before exec
            if cgroup is not None:
                cgroup.enter()
            if cpuset is not None:
                cpuset.enter()
            elif cpus is not None:  # no cpuset cgroup: an affinity its code may widen (logged at start)
                os.sched_setaffinity(0, cpus)
            with open("/proc/self/oom_score_adj", "w") as adj:  # inherited by all it runs: killed before the trainer
                adj.write(str(OOM_SCORE_ADJ))
            resource.setrlimit(resource.RLIMIT_CPU, (cfg.cpu_seconds, cfg.cpu_seconds + 1))
            resource.setrlimit(resource.RLIMIT_AS, (cfg.memory_mb * mib, cfg.memory_mb * mib))
            resource.setrlimit(resource.RLIMIT_FSIZE, (cfg.max_file_mb * mib, cfg.max_file_mb * mib))
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        # the uid as for an ordinary user: bubblewrap makes the user namespace as this uid
        return [*enter, *guard_argv(os.getpid(), uid)], reporting_child(limit)

    def run(self, command: str, timeout: float | None = None, channel: bool = False, *,
            ignore_flock: bool = False) -> CommandResult:
        """`Sandbox.run`; `ignore_flock`: `flock` succeeds without locking (`seccomp_program`) in this command."""
        if self._tmp is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        timeout = timeout or self.config.command_timeout
        prefix, limit = self._child()
        # the command's shell says it started (everything before it, bubblewrap included, has set up) and closes the
        # descriptor before the first line of the command, which cannot write to it: a failure before is the sandbox's
        started_read, started_write = os.pipe()
        passed = [started_write]  # descriptors the command line gets (bubblewrap: its --info-fd, its --seccomp)
        reader = None
        if channel:  # a pipe this process drains while the command runs: what was written is out of its reach
            channel_read, channel_write = os.pipe()
            passed.append(channel_write)
            reader = _Drain(channel_read, self.config.max_file_mb * 1024 * 1024)
            command = f"exec {CHANNEL_FD}>&{channel_write} {channel_write}>&-\n{command}"
        command = f"printf . >&{started_write}; exec {started_write}>&-\n{command}"
        info_read = None
        argv = []
        if self.isolated:
            info_read, info_write = os.pipe()
            seccomp_read, seccomp_write = os.pipe()
            # a few hundred bytes: within a pipe's buffer
            os.write(seccomp_write, seccomp_program(ignore_flock=ignore_flock))
            os.close(seccomp_write)
            passed += [info_write, seccomp_read]
            argv = [self._prefix[0], "--info-fd", str(info_write), "--seccomp", str(seccomp_read), *self._prefix[1:]]
        with tempfile.TemporaryFile() as out:  # outside the quota: a full sandbox still gets its error message
            oom = OomWatch(self._cgroup)
            try:
                proc = subprocess.Popen(
                    [*prefix, *argv, "/bin/bash", "-c", command],
                    cwd=self.workdir if self._space is None and not self.isolated else "/",
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={} if self.isolated else self._plain_env,
                    start_new_session=True,
                    preexec_fn=limit,
                    pass_fds=passed,
                )
            except (OSError, subprocess.SubprocessError) as e:  # a program missing, a cgroup gone...
                raise SandboxError(f"could not start the sandbox's command: {e}") from e
            finally:
                for fd in passed:
                    os.close(fd)
            init, timed_out = None, True
            try:
                init = _namespace_init(info_read) if self.isolated else None
                timed_out = not _wait(proc, timeout)
            finally:  # also when SIGTERM or SIGINT unwinds this process: nothing of the command outlives it
                if init is not None:  # the namespace's init, whatever ended bubblewrap: its end ends everything
                    _signal_pidfd(init, signal.SIGKILL)
                _signal(-proc.pid, signal.SIGKILL)  # bubblewrap itself; without it, the command's process group
                proc.wait()
                if init is not None:  # bubblewrap may report before the kernel has emptied the namespace: wait
                    _wait_fd(init, 10)
                    os.close(init)
            output, code = _read_capped(out, self.config.max_output_bytes), proc.returncode
            started = _read_marker(started_read)
            received = reader.result() if reader is not None else None  # every writer is gone with the namespace
            verdict = oom.verdict(killed=code == -signal.SIGKILL or code == 128 + signal.SIGKILL)
            if verdict == "machine":
                raise SandboxError("the machine ran out of memory while the sandbox ran the command (the kernel's "
                                   "OOM killer ended a process; the sandbox's own limit was not reached)")
            if verdict == "limit":  # the code's own doing, even where the killer picked bubblewrap or its init
                end = "\n" if output and not output.endswith("\n") else ""
                note = out_of_memory_note(self.config.total_memory_mb)
                return CommandResult(f"{output}{end}{note}\n", 128 + signal.SIGKILL, out_of_memory=True,
                                     channel=received)
            if self.isolated and code < 0 and not timed_out:  # only our timeout kills bubblewrap itself
                raise SandboxError(f"the sandbox was killed from outside ({signal.Signals(-code).name}: the "
                                   "machine's OOM killer, an operator) while it ran the command")
            if not started and not timed_out:
                raise SandboxError(f"the sandbox could not start the command (exit code {code}): "
                                   f"{output.strip()[-500:]}")
            if timed_out:
                end = "\n" if output and not output.endswith("\n") else ""
                return CommandResult(f"{output}{end}{timeout_note(timeout)}\n", TIMEOUT_EXIT_CODE, True,
                                     channel=received)
            return CommandResult(output, 128 - code if code < 0 else code, channel=received)

    # -- files -------------------------------------------------------------------------------------------------

    def _resolve(self, path: str) -> list[str]:
        """The components of `path` (relative to the checkout, or absolute under `workdir`) with every link in it
        resolved inside the checkout, as the sandbox would resolve it; SandboxPathError where it leaves the checkout
        (a link to an absolute path included). No command runs meanwhile, so nothing changes the links under us."""
        if self._tmp is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        inside = path
        if os.path.isabs(path) and (path == self.workdir or path.startswith(self.workdir.rstrip("/") + "/")):
            inside = os.path.relpath(path, self.workdir)
        outside = SandboxPathError(f"{path}: outside the repository; give a path inside it")
        if os.path.isabs(inside):
            raise outside
        pending, done, links = inside.split("/"), [], 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not done:
                    raise outside
                done.pop()
                continue
            here = os.path.join(self._tmp / "repo", *done, part)  # `done` holds real folders only
            if os.path.islink(here):
                target, links = os.readlink(here), links + 1
                if os.path.isabs(target) or links > 40:
                    raise outside
                pending = target.split("/") + pending
                continue
            done.append(part)
        if not done:
            raise SandboxPathError(f"{path}: the repository itself; give a file in it")
        return done

    def _open_parent(self, path: str, make: bool = False) -> tuple[int, str]:
        """A descriptor of the folder that holds `path` (resolved by `_resolve`) and the file's name in it, each
        folder opened without following a link; `make` creates missing folders."""
        parts = self._resolve(path)
        folder = open_folder(str(self._tmp / "repo"))
        try:
            for part in parts[:-1]:
                if make and not _exists(part, folder):
                    os.mkdir(part, 0o755, dir_fd=folder)
                    if self.uid is not None:
                        os.chown(part, self.uid, self.uid, dir_fd=folder, follow_symlinks=False)
                try:
                    inner = open_folder(part, dir_fd=folder)
                except SandboxPathError:
                    raise SandboxPathError(f"{path}: {part} is not a folder (a link is not followed)") from None
                os.close(folder)
                folder = inner
        except BaseException:
            os.close(folder)
            raise
        return folder, parts[-1]

    def read_file(self, path: str) -> str:
        folder, name = self._open_parent(path)
        try:
            data = read_regular(name, self.config.max_file_mb * 1024 * 1024, dir_fd=folder, shown=path)
        finally:
            os.close(folder)
        if b"\0" in data[:8192]:
            raise SandboxPathError(f"{path}: a binary file")
        return data.decode("utf-8", errors="replace")

    def write_file(self, path: str, text: str) -> None:
        folder, name = self._open_parent(path, make=True)
        try:
            if _exists(name, folder) and stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
                raise SandboxPathError(f"{path}: is a folder")
            write_regular(name, text.encode("utf-8"), dir_fd=folder, owner=self.uid)
        finally:
            os.close(folder)

    def _scratch_folder(self) -> int:
        """A descriptor of the scratch folder, refused if the sandbox has put anything else in its place."""
        if self._tmp is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        own_tmp = open_folder(str(self._tmp / "tmp"))  # its parent is the trainer's: it cannot be replaced
        try:
            return open_folder("swegym", dir_fd=own_tmp)
        finally:
            os.close(own_tmp)

    def write_scratch(self, name: str, text: str) -> str:
        name = Path(name).name
        folder = self._scratch_folder()
        try:
            try:
                os.unlink(name, dir_fd=folder)  # whatever the sandbox left there: a link, a FIFO, an old file
            except FileNotFoundError:
                pass
            write_regular(name, text.encode("utf-8"), dir_fd=folder, exclusive=True, mode=0o644)
        finally:
            os.close(folder)
        return f"{self.scratch_dir}/{name}"

    def bind_scratch_socket(self, name: str) -> tuple[socket.socket, str]:
        """A listening Unix socket at scratch file `name`, owned by the commands' uid so they can connect to it (a
        way in from commands that have no network: `agents/sandbox_endpoint.py`); returns it with its path as
        commands see it. Bound through a descriptor of the scratch folder, never through a link the sandbox made."""
        name = Path(name).name
        folder = self._scratch_folder()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                os.unlink(name, dir_fd=folder)
            except FileNotFoundError:
                pass
            listener.bind(f"/proc/self/fd/{folder}/{name}")
            if self.uid is not None and self.uid != os.getuid():
                os.chown(name, self.uid, -1, dir_fd=folder, follow_symlinks=False)
            listener.listen()
        except BaseException:
            listener.close()
            raise
        finally:
            os.close(folder)
        return listener, f"{self.scratch_dir}/{name}"

    def read_scratch(self, name: str) -> str | None:
        try:
            folder = self._scratch_folder()
        except SandboxPathError:
            return None
        try:
            data = read_regular(Path(name).name, self.config.max_file_mb * 1024 * 1024, dir_fd=folder)
        except SandboxPathError:
            return None
        finally:
            os.close(folder)
        return data.decode("utf-8", errors="replace")


def _cpuset(cpus: tuple[int, ...] | None, memory: MemoryCgroup | None) -> CpusetCgroup | None:
    """The cpuset cgroup a sandbox holding `cpus` runs its commands in, or None (no CPUs of its own; or none can be
    made, logged once: its commands then start with that affinity, which their code may widen)."""
    if cpus is None:
        return None
    try:
        return CpusetCgroup.create(cpus, memory.path if memory is not None else None)
    except OSError as e:
        warn_once("cpuset", f"sandbox CPUs: no cpuset cgroup could be made ({e}); a sandbox's commands start on "
                  "its own CPUs but may leave them (sched_setaffinity), so the timing channel between concurrent "
                  "sandboxes stays open; see the SWE-Gym README, 'Dedicated cores'")
        return None


def _remove(space: PrivateSpace | None, folder: Path, cgroup: MemoryCgroup | None,
            cpuset: CpusetCgroup | None) -> None:
    """Release a sandbox's space (its namespaces, or its host folder) and its cgroups."""
    if space is not None:
        space.close()
    else:
        shutil.rmtree(folder, ignore_errors=True)
    for group in (cgroup, cpuset):
        if group is not None:
            group.remove()


class _Drain:
    """Reads a pipe in a thread of its own until every writer is gone, keeping the first `limit` bytes (the rest is
    read and dropped, so a writer never blocks on a full pipe). `result()` waits for that end, at most `grace`
    seconds once the command is over (with isolation='none' a process that left the command's group may still hold
    the pipe: what it writes later is not read)."""

    def __init__(self, fd: int, limit: int, grace: float = 10.0):
        self._fd, self._limit, self._grace, self._data = fd, limit, grace, bytearray()
        self._over = threading.Event()
        self._thread = threading.Thread(target=self._read, name="sandbox-channel", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while not self._over.is_set():
                if not _wait_fd(self._fd, 0.2):
                    continue
                chunk = os.read(self._fd, 1 << 16)
                if not chunk:
                    break
                if len(self._data) < self._limit:
                    self._data += chunk[: self._limit - len(self._data)]
        finally:
            os.close(self._fd)

    def result(self) -> bytes:
        self._thread.join(self._grace)
        self._over.set()
        self._thread.join()
        return bytes(self._data)


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


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
        return _wait_fd(fd, timeout)
    finally:
        os.close(fd)


def _wait_fd(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _namespace_init(info_fd: int) -> int | None:
    """A pidfd of the PID namespace's init, from the JSON bubblewrap writes to `--info-fd` (closes `info_fd`)."""
    with os.fdopen(info_fd, "rb") as info:
        # bubblewrap closes its end once written (before the command starts), or when it fails
        text = info.read() if _wait_fd(info_fd, 30) else b""
    try:
        return os.pidfd_open(json.loads(text)["child-pid"])
    except (ValueError, KeyError, OSError):
        return None  # bubblewrap failed before it made the namespace, or its init is already gone


def _read_marker(fd: int) -> bool:
    """Whether the byte the command's shell writes when it starts came (closes `fd`; every writer has ended)."""
    with os.fdopen(fd, "rb") as marker:
        return marker.read(1) == b"."


def _signal_pidfd(fd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass


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
