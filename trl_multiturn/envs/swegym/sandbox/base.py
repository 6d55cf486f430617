"""The `Sandbox` interface every backend implements, its settings, and the errors it raises."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ....config_checks import Range, check_fields, config_field

SANDBOXES = ("local", "docker")
# A command run with `channel=True` finds this descriptor open for writing: what it writes there reaches the host as
# it is written (a pipe the host reads while the command runs; in Docker the exec's stderr stream), so nothing in the
# sandbox can take back, replace or truncate it afterwards (grading's test report travels on it).
CHANNEL_FD = 3
ISOLATIONS = ("bwrap", "none")
ENGINE_GAPS = ("warn", "refuse")
# Every sandbox command's `/proc/self/oom_score_adj` (both backends): the OOM killer picks the sandbox's processes
# first (a container's before its PID 1; the machine's before the trainer). Raising it needs no privilege.
OOM_SCORE_ADJ = 1000


@dataclass
class SandboxConfig:
    """How and where the agent's commands run. Limits apply to every command and to the grading test run.

    Parameters:
        > Parameters that control the backend

        sandbox (`str`, defaults to `"local"`):
            Sandbox backend: 'local' (bubblewrap) or 'docker'.

        > Parameters that control the limits of every command

        command_timeout (`float`, defaults to `30.0`):
            Wall-clock seconds a command may run before its processes are killed.
        cpu_seconds (`int`, defaults to `60`):
            CPU-time limit of each process (RLIMIT_CPU), seconds.
        memory_mb (`int`, defaults to `4096`):
            Address-space limit of each process (RLIMIT_AS), MiB; Docker: the container's memory, its files included.
        max_processes (`int`, defaults to `128`):
            Process-count limit (RLIMIT_NPROC per sandbox uid locally, pids_limit in Docker).
        max_file_mb (`int`, defaults to `64`):
            Largest file a command may write (RLIMIT_FSIZE), MiB.
        disk_mb (`int`, defaults to `4096`):
            Size of the sandbox's writable space, MiB (local, as root: a tmpfs; Docker: a tmpfs per writable folder).
        total_memory_mb (`int`, defaults to `8192`):
            Local: memory of all the sandbox's processes together (a cgroup's limit), MiB.
        max_output_bytes (`int`, defaults to `1_000_000`):
            Bytes of a command's output read back (its head and tail).

        > Parameters that control the sandbox's CPUs

        sandbox_cpus (`int`, defaults to `0`):
            CPUs each running sandbox holds for itself, no other sandbox of the machine running on them (0: share).
        cpu_wait (`float`, defaults to `600.0`):
            Seconds a sandbox's start waits for its CPUs to come free before it fails (an infrastructure failure).

        > Parameters that control the local sandbox's isolation

        isolation (`str`, defaults to `"bwrap"`):
            Local only: 'bwrap' (namespaces and a seccomp filter) or 'none'.
        run_as_uid (`str`, defaults to `"auto"`):
            Local, bwrap, as root: the uid commands run as ('auto': one per sandbox, a number, or 'none').
        uid_base (`int`, defaults to `200_000`):
            Local, as root: first uid handed to sandboxes.
        uid_count (`int`, defaults to `10_000`):
            Local, as root: how many uids sandboxes may use.
        root_extra (`list[str]`, defaults to `[]`):
            Local, bwrap: host files or folders added to each sandbox's private root (node for Codex, say).

        > Parameters that control the local sandbox's repositories

        task_python (`str`, *optional*):
            Local: a Python virtual environment that commands get as `python` (None: built once per machine).
        repos_dir (`str`, *optional*):
            Local: folder of git clones named OWNER__NAME for task rows outside the shipped set.
        repo_cache_dir (`str`, *optional*):
            Where shipped task repositories and the task Python are built (default: the package's cache folder).

        > Parameters that control the Docker sandbox

        docker_image_template (`str`, defaults to `"xingyaoww/sweb.eval.x86_64.{instance_id}:latest"`):
            Docker image of a task.
        docker_dunder (`str`, defaults to `"_s_"`):
            How '__' in instance ids is spelt in image names.
        docker_workdir (`str`, defaults to `"/testbed"`):
            Repository folder inside the image.
        docker_user (`str`, defaults to `"root"`):
            User the commands run as inside the container.
        docker_shell_init (`str`, defaults to `"source /opt/miniconda3/bin/activate testbed"`):
            Shell line run before every command in the container.
        docker_cpus (`float`, defaults to `1.0`):
            CPU time each container may use, in CPUs (within its `sandbox_cpus` CPUs).
        docker_network (`bool`, defaults to `False`):
            Give containers network access.
        docker_writable (`list[str]`, defaults to `["/var/tmp", "/root"]`):
            Folders of the image a container may write besides the repository and /tmp; the rest is read-only.
        docker_engine_gaps (`str`, defaults to `"warn"`):
            What to do when the engine lacks per-container files or a remapped user namespace, or this
            process cannot make a container's files resident (a remote engine, not root).
    """

    # Parameters that control the backend
    sandbox: str = field(default="local", metadata={"help": "Sandbox backend: 'local' (bubblewrap) or 'docker'."})

    # Parameters that control the limits of every command
    command_timeout: float = config_field(
        30.0, "Wall-clock seconds a command may run before its processes are killed.", range=Range(gt=0))
    cpu_seconds: int = config_field(60, "CPU-time limit of each process (RLIMIT_CPU), seconds.", range=Range(ge=1))
    memory_mb: int = config_field(
        4096, "Address-space limit of each process (RLIMIT_AS), MiB; Docker: also the container's memory, the files "
              "it writes included (they are tmpfs pages: see disk_mb).", range=Range(ge=1))
    max_processes: int = config_field(
        128, "Process-count limit (RLIMIT_NPROC per sandbox uid locally, pids_limit in Docker).", range=Range(ge=1))
    max_file_mb: int = config_field(
        64, "Largest file a command may write, output included (RLIMIT_FSIZE), MiB; also the size of the local "
            "sandbox's private /dev/shm.", range=Range(ge=1))
    disk_mb: int = config_field(
        4096, "Local, as root: size of the tmpfs that holds the sandbox's writable folders (the checkout and its "
              "/tmp), MiB, mounted in the sandbox's own mount namespace, never on the host; writing past it fails "
              "with ENOSPC and nothing reaches the host disk. Not root: no quota (logged once). Docker (changed in "
              "wave 11; was --storage-opt size, what a container might write beyond its image on the engine's "
              "disk): the size of each folder a container may write (the repository, /tmp, docker_writable), a "
              "tmpfs of its own with the image's content of that folder copied in (a repository larger than this "
              "cannot start: SandboxError); the container's root is read-only, so nothing it writes reaches a "
              "disk. Those files are the container's memory: memory_mb bounds them all together (a test run "
              "that writes past it is OOM-killed, the code's own failure).",
        range=Range(ge=1))
    total_memory_mb: int = config_field(
        8192, "Local: memory of all the sandbox's processes together (tmpfs files they write included), MiB, as a "
              "cgroup's limit, where a memory cgroup can be made (root, cgroup v1 or v2); elsewhere only the "
              "per-process limits hold (logged once). Docker: memory_mb is the container's total.", range=Range(ge=1))
    max_output_bytes: int = config_field(
        1_000_000, "Bytes of a command's output read back (its head and tail); the middle is dropped.",
        range=Range(ge=1))

    # Parameters that control the sandbox's CPUs
    sandbox_cpus: int = config_field(
        0, "CPUs each running sandbox holds for itself: no other sandbox of the machine (in any process) runs on them "
           "meanwhile, so another sandbox's load never takes its CPU time (the timing channel between them, "
           "narrowed: the SWE-Gym README, 'Dedicated cores'). Locally its processes "
           "run in a cpuset cgroup of them (as root; else with that CPU affinity, which they may widen: logged "
           "once), in Docker the container's cpuset. A sandbox waits for free ones at start (cpu_wait), and an "
           "environment's holds them for its whole episode, so at most (CPUs / sandbox_cpus) episodes run at once. "
           "0 (the default): share the machine's CPUs; the timing channel between sandboxes stays open, and it "
           "stays mostly open with them too where other processes share the CPUs (measured: the SWE-Gym README, "
           "'Dedicated cores').", range=Range(ge=0))
    cpu_wait: float = config_field(
        600.0, "Seconds a sandbox's start waits for sandbox_cpus CPUs to come free, before any command runs (no "
               "command's or grading's time limit counts it); then SandboxError, an infrastructure failure, never a "
               "result.", range=Range(gt=0))

    # Parameters that control the local sandbox's isolation
    isolation: str = field(
        default="bwrap",
        metadata={
            "help": "Local only. 'bwrap': every command runs under bubblewrap with its own user, network, PID, IPC, "
            "UTS, cgroup and mount namespaces and a seccomp filter, seeing only the checkout and a private copy of a "
            "minimal root (/usr, /etc and a Python built for the tasks; `root_extra`) (needs the `bwrap` program and "
            "unprivileged user namespaces). 'none': a "
            "plain subprocess with "
            "resource limits only, for machines without bubblewrap; it contains runaway commands, nothing else "
            "(see the SWE-Gym README)."
        },
    )
    run_as_uid: str = field(
        default="auto",
        metadata={
            "help": "Local, bwrap, as root. 'auto': each sandbox runs its commands as a uid of its own taken from "
            "[uid_base, uid_base+uid_count). A number: that uid. 'none': stay uid 0 (without capabilities), which "
            "leaves the process limit unenforced and root-only files in the visible folders readable. Not root: "
            "commands always run as the current user."
        },
    )
    uid_base: int = config_field(200_000, "Local, as root: first uid handed to sandboxes.", range=Range(ge=0))
    uid_count: int = config_field(10_000, "Local, as root: how many uids sandboxes may use.", range=Range(ge=1))
    root_extra: list[str] = config_field(
        help="Local, bwrap: host files or folders (absolute paths) added, at their own paths, to the minimal root "
        "each sandbox gets a private copy of in place of the host's /usr (`sandbox/rootfs.py`), for programs an agent "
        "runs inside the sandbox; the shared libraries of the programs among them come along. Each concurrent "
        "sandbox holds a copy (as root: in memory), so they cost their size per sandbox. The Codex CLI environment "
        "adds node and its package.", default_factory=list)

    # Parameters that control the local sandbox's repositories
    task_python: str | None = field(
        default=None,
        metadata={
            "help": "Local: a Python virtual environment (its folder) that commands get as `python`. None builds "
            "one once per machine under the cache folder, from this interpreter's base Python, with the shipped "
            "tasks' test requirements (pytest); the trainer's own environment is never visible to commands."
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
        metadata={"help": "Where shipped task repositories and the task Python are built (default "
                  "$TRL_MULTITURN_CACHE/swegym, else ~/.cache/trl_multiturn/swegym: `trl_multiturn.cache`)."},
    )

    # Parameters that control the Docker sandbox
    docker_image_template: str = field(
        default="xingyaoww/sweb.eval.x86_64.{instance_id}:latest",
        metadata={"help": "Docker image of a task; {instance_id} is the lower-cased id with '__' spelt as below. "
                  "Rows with an `image_name` column, and the shipped tasks, name their own image."},
    )
    docker_dunder: str = field(
        default="_s_",
        metadata={"help": "How '__' in instance ids is spelt in image names ('_s_' SWE-Gym, '_1776_' SWE-bench)."},
    )
    docker_workdir: str = field(default="/testbed", metadata={"help": "Repository folder inside the image."})
    docker_user: str = field(default="root", metadata={"help": "User the commands run as inside the container."})
    docker_shell_init: str = field(
        default="source /opt/miniconda3/bin/activate testbed",
        metadata={"help": "Shell line run before every command in the container (activates the task's env; its "
                  "failure is ignored, so images without conda work too)."},
    )
    docker_cpus: float = config_field(
        1.0, "CPU time each container may use, in CPUs (nano_cpus), within the sandbox_cpus CPUs it holds (if any).",
        range=Range(gt=0))
    docker_network: bool = field(default=False, metadata={"help": "Give containers network access."})
    docker_writable: list[str] = config_field(
        help="Folders (absolute paths in the image) a container may write besides the repository (docker_workdir) "
        "and /tmp: each a tmpfs of disk_mb with the image's content copied in at start (HOME for the default "
        "user, root: caches and configuration files of the tests' tools); everything else of the image is "
        "read-only, so that nothing a container writes reaches the engine's disk.",
        default_factory=lambda: ["/var/tmp", "/root"])
    docker_engine_gaps: str = field(
        default="warn",
        metadata={"help": "What to do when the Docker engine lacks what the SWE-Gym README asks of it: a storage "
                  "driver that gives each container files of its own (btrfs, zfs; overlay2 shares "
                  "the image's files, their page cache a channel between gradings) and --userns-remap (else a "
                  "container's root is the host's uid 0), and this process reading a container's files from the "
                  "host to make them resident before its first command (a remote engine, or not root, cannot). "
                  "'warn': log each gap once and go on; 'refuse': SandboxError at start, naming them."},
    )

    def __post_init__(self):
        check_fields(self)
        if self.sandbox not in SANDBOXES:
            raise ValueError(f"sandbox={self.sandbox!r}: choose one of {SANDBOXES}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation={self.isolation!r}: choose one of {ISOLATIONS}")
        if self.run_as_uid not in ("auto", "none") and not str(self.run_as_uid).isdigit():
            raise ValueError(f"run_as_uid={self.run_as_uid!r}: use 'auto', 'none' or a numeric uid")
        if self.docker_engine_gaps not in ENGINE_GAPS:
            raise ValueError(f"docker_engine_gaps={self.docker_engine_gaps!r}: choose one of {ENGINE_GAPS}")
        for path in self.docker_writable:
            if not path.startswith("/") or path.rstrip("/") == "":
                raise ValueError(f"docker_writable: {path!r} is no absolute path of a folder below /; give folders "
                                 "such as '/root'")
        for path in self.root_extra:
            if not os.path.isabs(path) or not os.path.lexists(path):
                raise ValueError(f"root_extra: {path!r} is no absolute path of a file or folder on this machine; give "
                                 "the absolute path of a program or folder the sandbox's commands need")
        usable = len(os.sched_getaffinity(0))
        if self.sandbox_cpus > usable:
            raise ValueError(f"sandbox_cpus={self.sandbox_cpus}: this machine lets this process run on {usable} "
                             f"CPUs; give at most {usable}, or 0 to share them (no dedicated cores)")
        if self.sandbox == "docker" and 0 < self.sandbox_cpus < self.docker_cpus:
            raise ValueError(f"docker_cpus={self.docker_cpus:g}: a container holds sandbox_cpus={self.sandbox_cpus} "
                             f"CPUs and cannot use more; give docker_cpus <= {self.sandbox_cpus}, or raise "
                             "sandbox_cpus")
        if self.isolation == "none" and str(self.run_as_uid).isdigit():
            raise ValueError(f"run_as_uid={self.run_as_uid}: switching user needs isolation='bwrap'")


def exit_on_sigterm() -> None:
    """Make SIGTERM end this process as SystemExit does, so that sandboxes are closed (their folders and containers
    removed) when a script that drives them is stopped; only where SIGTERM still has its default action, from the
    main thread. (SIGINT already raises KeyboardInterrupt; SIGKILL leaves nothing either: see the README.)"""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


TIMEOUT_EXIT_CODE = 124  # as coreutils' `timeout` reports a command it cut


def timeout_note(seconds: float) -> str:
    """The last line of the output of a command cut at its wall-clock limit (its exit code is TIMEOUT_EXIT_CODE)."""
    return f"[command timed out after {seconds:g} s]"


def out_of_memory_note(megabytes: int) -> str:
    """The last line of the output of a command whose process the kernel killed for the sandbox's memory limit."""
    return f"[a process was killed: the sandbox reached its memory limit of {megabytes} MiB]"


@dataclass
class CommandResult:
    """A finished command: its output (stdout and stderr interleaved), exit code and whether it timed out. A
    command cut at its limit ends its output with `timeout_note` and exits with TIMEOUT_EXIT_CODE.
    `out_of_memory`: the kernel killed a process of the command for reaching the sandbox's own memory limit (the
    code's doing, like any crash; the output ends with `out_of_memory_note`). The machine running out of memory is
    not a result: it raises SandboxError. `channel`: for a command run with `channel=True`, the bytes its processes
    wrote to `CHANNEL_FD`, in order, as the host received them while it ran (at most `max_file_mb`; the rest is
    dropped), else None."""

    output: str
    exit_code: int
    timed_out: bool = False
    out_of_memory: bool = False
    channel: bytes | None = None


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

    `start(task)` prepares the checkout; `run` executes one bash command in the repository root (`workdir`, the
    path as commands see it), with `channel=True` also handing it `CHANNEL_FD`, whose bytes come back in
    `CommandResult.channel`; `read_file` / `write_file` take paths relative to that root (or absolute ones
    inside it) and refuse any other; `write_scratch` / `read_scratch` store and fetch files in `scratch_dir`, a
    folder outside the checkout, which the sandbox's user may write (grading keeps its patches and its git folder
    there; the test report takes the channel, which that user cannot rewrite); every process a command started
    ends with it; `close` removes everything. Reusable as a context manager.
    """

    workdir: str = ""
    scratch_dir: str = "/tmp/swegym"

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()

    @abstractmethod
    def start(self, task: dict) -> None: ...

    @abstractmethod
    def run(self, command: str, timeout: float | None = None, channel: bool = False) -> CommandResult: ...

    @abstractmethod
    def read_file(self, path: str) -> str: ...

    @abstractmethod
    def write_file(self, path: str, text: str) -> None: ...

    @abstractmethod
    def write_scratch(self, name: str, text: str) -> str:
        """Store `text` as scratch file `name`; returns its path as commands see it."""

    @abstractmethod
    def read_scratch(self, name: str) -> str | None:
        """The text of scratch file `name`, or None when there is none."""

    @abstractmethod
    def close(self) -> None: ...

    def diff(self, base_commit: str) -> str:
        """The checkout's changes against `base_commit` as a git diff, new files included, caches left out.

        External diff drivers and textconv filters are switched off, so the repository's own git config cannot
        rewrite the diff; what the diff may contain is checked again when it is graded. The diff goes to a scratch
        file and is read from there, so a diff longer than a command's output (`max_output_bytes`: a data file
        of a correct fix) is whole; one over `max_file_mb` raises DiffError saying so.
        """
        out = shlex.quote(f"{self.scratch_dir}/agent.diff")
        result = self.run(
            f"mkdir -p {shlex.quote(self.scratch_dir)} && rm -f {out} && "
            "git add -A -- . ':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/*.pyc' "
            "':(exclude,glob)**/.pytest_cache/**' >/dev/null 2>&1; "
            "git -c core.fileMode=false diff --cached --no-color --no-ext-diff --no-textconv --binary "
            f"{shlex.quote(base_commit)} > {out}; code=$?; wc -c < {out}; exit $code",
            timeout=max(self.config.command_timeout, 60),
        )
        words, limit = result.output.split(), self.config.max_file_mb * 1024 * 1024
        if words and words[-1].isdigit() and int(words[-1]) >= limit:  # at the limit, RLIMIT_FSIZE cut it
            raise DiffError(f"the diff reaches the {self.config.max_file_mb} MB a file may have (max_file_mb): "
                            "nothing was graded; keep large data files out of the fix")
        if result.exit_code != 0:
            raise DiffError(f"git diff failed in the checkout: {result.output[-2000:]}")
        return self.read_scratch("agent.diff") or ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
