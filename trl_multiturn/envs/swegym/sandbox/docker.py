"""`DockerSandbox`: the task's image in a fresh container per episode and per grading, through the Docker SDK.

Containers run without network (`--network none`), without any capability, with `no-new-privileges`, a seccomp profile
(the keyring, ptrace, bpf, mounts, namespaces, io_uring... denied), IPC, PID, UTS and cgroup namespaces of their own
(IPC and cgroup stated explicitly, not left to the daemon's defaults; PID and UTS are private unless asked otherwise),
a private /dev/shm, a PID 1 that reaps orphans and outlives `kill -9 -1`, memory, pids and CPU limits, and storage of
its own: the image's files read-only, and every folder a container may write (the repository, /tmp, HOME:
`writable_folders`) a tmpfs of `disk_mb` with the image's content copied in, whose pages are the container's memory;
the engine keeps no log of its output. No container writes to the engine's file system, so none moves the free space
that another one (running or later) reads there, and none fills the host's disk (the SWE-Gym README,
"Containment"). The seccomp profile is the local sandbox's filter
(`seccomp.docker_profile`), which also refuses page-cache residency calls, locks and watches on the image's shared
files, and `sysinfo`; the machine's memory statistics and activity counters are hidden (`procview.py`: /proc/meminfo,
/proc/stat and /proc/loadavg fixed views, the rest masked beside the engine's own masked paths, /sys masked but for the
container's cgroup and the CPUs). A process the kernel kills for the container's own memory limit is the command's
doing (`CommandResult.out_of_memory`); the machine running out is `SandboxError`. A container that does not start, or
that stops under a command (killed from outside, its engine gone), raises `SandboxError`: an infrastructure failure,
never a result; a start is tried `START_ATTEMPTS` times when the engine's error may pass. Containers a driver killed
between their create and their start left are removed before the next sandbox's create (`orphans.py`). SWE-Gym's images
are named after the instance id; the shipped tasks' images are built on this machine (`images.py`) and named after
their recipe.
Each container runs on CPUs of its own (`cpus.py`: `cpuset_cpus`), so /proc/uptime is a fixed view too.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import shlex
import tarfile
import time
from typing import Any

import psutil

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
from .containment import DEVPTS_OPTIONS, MemoryCgroup, OomWatch, warn_once
from .cpus import CpuLease
from .orphans import DRIVER_LABEL, driver_identity, reap
from .procview import FIXED, SHARED, masked_paths, write_views
from .residency import ContainerRoot, make_resident
from .seccomp import docker_profile

# Storage drivers that make each container's files inodes of its own (a snapshot per container: the page cache,
# locks and watches of one container's files are not another's). overlay2 shares the image's files between containers.
PRIVATE_FILES_DRIVERS = ("btrfs", "zfs")


def engine_gaps(info: dict) -> list[str]:
    """What an engine (its `docker info`) lacks of what the Docker sandbox asks of it (the SWE-Gym README)."""
    gaps = []
    driver = info.get("Driver")
    if driver not in PRIVATE_FILES_DRIVERS:
        gaps.append(f"the storage driver {driver!r} shares the image's files between containers (their page cache "
                    f"carries state from one grading to the next): use {' or '.join(PRIVATE_FILES_DRIVERS)}")
    if not any("name=userns" in option for option in info.get("SecurityOptions") or []):
        gaps.append("the engine runs without --userns-remap: a container's root is the host's uid 0")
    return gaps


def docker_image_name(instance_id: str, config: SandboxConfig | None = None) -> str:
    """The image SWE-Gym publishes for `instance_id`: `xingyaoww/sweb.eval.x86_64.<id>:latest`, lower-cased,
    with `__` spelt `_s_` (Docker Hub forbids double underscores), as OpenHands and the SWE-Gym release name them.
    """
    config = config or SandboxConfig()
    return config.docker_image_template.format(instance_id=instance_id.replace("__", config.docker_dunder).lower())


def task_image(task: dict, config: SandboxConfig | None = None) -> str:
    """The image a task row runs in: its `image_name` column; for a shipped task, the image `images.py` builds
    for it; else SWE-Gym's image for its instance id."""
    from .images import shipped_source, task_image_name

    if task.get("image_name"):
        return task["image_name"]
    source = shipped_source(task)
    return task_image_name(source) if source is not None else docker_image_name(task["instance_id"], config)


# The container's PID 1 (bash): it reaps orphans at once (bash reaps every child that ends while it `wait`s), survives
# a `kill -9 -1` from inside (which the kernel never delivers to PID 1), so the agent cannot stop its own container,
# and ends once a second after its stdin does, which the engine closes when the sandbox's attached socket closes:
# when the sandbox is closed, or its process dies however it dies. Then the engine removes the container.
KEEPER = ("mkdir -p {scratch}; trap '' TERM INT HUP; "
          "while :; do sleep 1 & wait $!; if read -r -t 0; then read -r _ || exit 0; fi; done")
OUTPUT_DIR = "/run/trl-multiturn-output"  # commands' output files (a tmpfs of their own: outside disk_mb)
SETTLE_CHECKS = 15  # times a command ended by a signal asks again, 0.2 s apart, whether its container still runs
COPY_TIMEOUT = 600  # seconds to copy a folder's content from the image into its tmpfs, or a file in or out
_ENGINES: dict[str, dict] = {}  # `docker info` of each engine, by its address
_ENGINE_MASKS: dict[str, list[str]] = {}  # the paths each engine masks in a container by default, by its address
START_ATTEMPTS = 3  # a container start that failed in the engine (runc's "broken pipe" on a loaded machine)
logger = logging.getLogger(__name__)


class DockerSandbox(Sandbox):
    """The task's image in a fresh container; commands through `docker exec` (the Docker SDK).

    The image holds the repository at the base commit in `docker_workdir` and its environment. A shipped task's
    image is built on first use from the base image (`python -m trl_multiturn.envs.swegym.sandbox.images` builds
    that once per machine). `client` is a `docker.DockerClient` (default: `docker.from_env()`).
    """

    scratch_dir = "/tmp/swegym"

    def __init__(self, config: SandboxConfig | None = None, client: Any = None):
        super().__init__(config)
        self._client = client
        self.container = None
        self._lifeline = None  # the attached stdin socket: the container lives while it is open
        self._memory: MemoryCgroup | None = None  # the container's memory cgroup, where the engine is local
        self._cpu_lease: CpuLease | None = None
        self.cpus: tuple[int, ...] | None = None  # the CPUs the container runs on, its own (`cpus.py`); None: shared
        self.workdir = self.config.docker_workdir

    def image_for(self, task: dict) -> str:
        return task_image(task, self.config)

    def container_options(self, task: dict) -> dict[str, Any]:
        """Keyword arguments of `client.containers.run` for `task` (the fixed /proc views it binds are files of
        this machine's, `procview.SHARED`: the engine must run on this machine; `_create` adds the masked paths)."""
        cfg = self.config
        views = write_views(SHARED, cfg.memory_mb)
        space = f"size={cfg.disk_mb}m,exec"  # the repository's programs and built extensions run from it
        return {
            "image": self.image_for(task),
            "command": ["/bin/bash", "-c", KEEPER.format(scratch=shlex.quote(self.scratch_dir))],
            "detach": True,
            "stdin_open": True,  # with create's detach=False, also StdinOnce: the first attached client's end ends it
            "auto_remove": True,
            "working_dir": cfg.docker_workdir,
            "user": cfg.docker_user,
            "mem_limit": f"{cfg.memory_mb}m",
            "pids_limit": cfg.max_processes,
            "nano_cpus": int(cfg.docker_cpus * 1e9),
            **({"cpuset_cpus": ",".join(map(str, self.cpus))} if self.cpus is not None else {}),
            "network_mode": "bridge" if cfg.docker_network else "none",
            "ipc_mode": "private",  # its own IPC namespace and /dev/shm, which no other container may join
            "shm_size": cfg.max_file_mb * 1024 * 1024,
            # the image's files read-only; what a container writes is in tmpfs mounts of its own (their content
            # copied from the image by `_fill_writable`), never on the engine's file system, and nothing it prints
            # to its PID 1's output is logged there either
            "read_only": True,
            "tmpfs": {OUTPUT_DIR: f"size={cfg.max_file_mb + 1}m,mode=0700",
                      **dict.fromkeys(self.writable_folders(), space)},
            "log_config": {"type": "none"},
            "cgroupns": "private",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges", f"seccomp={docker_profile()}"],
            # runc lets only the files lxcfs emulates be bound over /proc: the other views are masked (`_create`)
            "volumes": {str(views[path]): {"bind": path, "mode": "ro"} for path in FIXED},
            # a devpts instance of its own with a cap (the engine's has none): an anonymous volume the engine mounts,
            # removed with the container
            "mounts": [{"Target": "/dev/pts", "Type": "volume", "VolumeOptions": {"DriverConfig": {
                "Name": "local", "Options": {"type": "devpts", "device": "devpts", "o": DEVPTS_OPTIONS}}}}],
            "labels": {"trl_multiturn.swegym": task["instance_id"], DRIVER_LABEL: driver_identity()},
        }

    def exec_command(self, command: str, timeout: float | None = None, channel: bool = False) -> list[str]:
        """The argv `docker exec` runs for `command`: the env's init line, CPU, file-size and address-space limits
        (as the local sandbox sets them; the container's memory limit holds besides), a wall-clock
        `timeout` (exit code 124 and a last line saying so when it fires) and the output cut to `max_output_bytes`,
        on the exec's stdout. The exec's stderr is `CHANNEL_FD` of the command with `channel` (the host reads it as
        it comes, `run`), else nothing (the outer shell's own errors go to the output).

        Every process the command leaves behind is killed when it ends (`kill -9 -1` spares only the caller and
        PID 1), as in the local sandbox. The output goes to a fresh file, not to the exec's stream, so that no
        process can hold the stream open and the call past its timeout; the file is in a tmpfs of its own
        (`OUTPUT_DIR`), outside the writable folders' `disk_mb`, so that a command that filled them still gets its
        error message. The scratch folder is made here too: the first command may come before PID 1 has made it.
        """
        cfg = self.config
        timeout = timeout or cfg.command_timeout
        inner = (
            f"{cfg.docker_shell_init} >/dev/null 2>&1; "
            f"ulimit -t {cfg.cpu_seconds} -f {cfg.max_file_mb * 1024} -v {cfg.memory_mb * 1024}; "
            f"cd {shlex.quote(cfg.docker_workdir)} && {command}"
        )
        outer = (  # the command's processes, not PID 1, are the ones the OOM killer picks in the container
            f"exec {f'{CHANNEL_FD}>&2 ' if channel else ''}2>&1; echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj; "
            f"mkdir -p {shlex.quote(self.scratch_dir)}; out=$(mktemp {OUTPUT_DIR}/out.XXXXXXXXXX) || exit 1; "
            f'timeout -k 5 {timeout:g} /bin/bash -c {shlex.quote(inner)} </dev/null >"$out" 2>&1; code=$?; '
            f'kill -9 -1 2>/dev/null; head -c {cfg.max_output_bytes} -- "$out"; rm -f -- "$out"; '
            f'[ $code -ne {TIMEOUT_EXIT_CODE} ] || echo {shlex.quote(timeout_note(timeout))}; exit $code'
        )
        return ["/bin/bash", "-c", outer]

    def writable_folders(self) -> list[str]:
        """The folders a container may write, each a tmpfs of `disk_mb`: the repository, the scratch folder's parent
        and `docker_writable`."""
        cfg = self.config
        return list(dict.fromkeys([cfg.docker_workdir, posixpath.dirname(self.scratch_dir), *cfg.docker_writable]))

    @property
    def client(self):
        if self._client is None:
            try:
                import docker
            except ImportError as e:
                raise SandboxError("sandbox='docker' needs the Docker SDK: pip install docker") from e
            try:
                self._client = docker.from_env()
            except Exception as e:
                raise SandboxError(f"no Docker engine answers ({e}): start dockerd, or set DOCKER_HOST") from e
        return self._client

    def _engine_info(self) -> dict:
        """The engine's `docker info`, asked once per client."""
        key = self.client.api.base_url
        if key not in _ENGINES:
            _ENGINES[key] = self.client.info()
        return _ENGINES[key]

    def check_engine(self) -> None:
        """Log each gap of the engine once (`docker_engine_gaps='warn'`), or refuse it ('refuse')."""
        self._report_gaps(engine_gaps(self._engine_info()))

    def _report_gaps(self, gaps: list[str]) -> None:
        if gaps and self.config.docker_engine_gaps == "refuse":
            raise SandboxError("the Docker engine lacks what the sandbox needs (docker_engine_gaps='refuse'): "
                               + "; ".join(gaps) + ". See the SWE-Gym README, 'Containment', for how to run one")
        for gap in gaps:
            warn_once(f"docker: {gap}", f"Docker sandbox: {gap} (see the SWE-Gym README, 'Containment')")

    def start(self, task: dict) -> None:
        from .images import ensure_task_image, shipped_source

        self.close()
        exit_on_sigterm()
        self.check_engine()
        source = shipped_source(task)
        if source is not None and not task.get("image_name"):
            ensure_task_image(self.client, source)
        if self.config.sandbox_cpus:  # waits for them here, before any command's time limit starts
            self._cpu_lease = CpuLease(self.config.sandbox_cpus, self.config.cpu_wait)
            self.cpus = self._cpu_lease.cpus
        try:
            self.container = self._start_container(self.container_options(task))
            self._memory = MemoryCgroup.of_container(self.container.id)
            self._fill_writable()
            self._make_resident()
        except BaseException:
            self.close()  # its CPUs too
            raise

    def _fill_writable(self) -> None:
        """Copy the image's content of each writable folder into its tmpfs, which covers it in the container: the
        engine reads it from the container's own files (its archive of a path does not see a container's tmpfs
        mounts), and `tar`, run as the container's root in the container, writes it, modes kept, every file the
        container's root's (an engine that remaps users reports the host's ids in its archives); its pages are the
        container's memory. A folder the image lacks stays empty. A copy that fails (the content
        larger than disk_mb) is SandboxError."""
        import docker

        for folder in self.writable_folders():
            try:
                stream, _ = self.client.api.get_archive(self.container.id, folder)
            except docker.errors.NotFound:
                continue
            except docker.errors.DockerException as e:
                raise SandboxError(f"could not read the image's {folder} from the container: {e}") from e
            parent = posixpath.dirname(folder.rstrip("/")) or "/"
            code, _, errors = self._exec(["tar", "-x", "--no-same-owner", "-C", parent, "-f", "-"], stream)
            if code != 0:
                raise SandboxError(f"could not copy the image's {folder} into the container's writable space "
                                   f"(disk_mb={self.config.disk_mb} MiB; raise it if the folder is larger): "
                                   f"{errors.decode(errors='replace')[-1000:]}")

    def _make_resident(self) -> None:
        """Every page of the container's files resident before its first command (`residency.py`): what other
        containers of the image read leaves nothing this one's reads could time. A gap where this machine cannot
        read the container's root (a remote engine, not root); a container that is not running, or a walk that
        fails or outlives the container's PID 1, is `SandboxError`."""
        self.container.reload()
        state = self.container.attrs["State"]
        if not state.get("Running"):
            raise SandboxError(f"the container stopped as it started (it is {self.container.status})")
        root = ContainerRoot.open(state.get("Pid", 0), self.container.id)
        if root is None:
            self._report_gaps(["this process cannot read the container's files from the host (a remote engine, or "
                               "not root), so they cannot be made resident before it starts: the cache of the "
                               "image's blocks below the page cache carries state from one grading to the next"])
            return
        with root:
            try:
                make_resident(root.fd)
            except OSError as e:  # an infrastructure failure
                self.container.reload()
                raise SandboxError(f"the container's files could not be read to make them resident ({e}); the "
                                   f"container is {self.container.status}") from e
            root.check_running()

    def _start_container(self, options: dict[str, Any]):
        """Create and start a container; an engine error (HTTP 5xx, the engine unreachable) is tried again after a
        pause, up to START_ATTEMPTS starts, removing the container each failed start left."""
        import docker
        import requests

        options = {k: v for k, v in options.items() if k != "detach"}
        reap(self.client.api)  # what drivers killed between a create and a start left (`orphans.py`)
        for attempt in range(1, START_ATTEMPTS + 1):
            container = None
            try:
                container = self._create(options)
                self._lifeline = container.attach_socket(params={"stdin": 1, "stream": 1})
                container.start()
                return container
            except Exception as e:
                self._close_lifeline()
                if container is not None:
                    _remove_quietly(container)
                transient = isinstance(e, docker.errors.APIError) and e.is_server_error() or isinstance(
                    e, requests.exceptions.ConnectionError)
                if not transient or attempt == START_ATTEMPTS:
                    raise SandboxError(f"could not start a container of {options['image']} (attempt {attempt} of "
                                       f"{START_ATTEMPTS}): {e}") from e
                logger.warning("starting a container of %s failed (%s); trying again", options["image"], e)
                time.sleep(attempt)

    def _create(self, options: dict[str, Any]):
        """`client.containers.create(**options)`, masking besides the engine's own masked paths those of
        `procview.masked_paths` (the SDK has no argument for the engine's `HostConfig.MaskedPaths`, which replace
        the engine's own when given, so these are learnt once per engine from a container created, never
        started, and labelled with its driver like the sandbox's own: `orphans.reap` removes it if the driver dies
        before it does)."""
        from docker.models.containers import _create_container_args

        api = self.client.api
        if api.base_url not in _ENGINE_MASKS:
            probe = api.create_container(options["image"], "true", labels=options["labels"])["Id"]
            try:
                _ENGINE_MASKS[api.base_url] = api.inspect_container(probe)["HostConfig"].get("MaskedPaths") or []
            finally:
                api.remove_container(probe, force=True)
        args = _create_container_args({**options, "version": api._version})
        args["host_config"]["MaskedPaths"] = list(dict.fromkeys([*_ENGINE_MASKS[api.base_url], *masked_paths()]))
        return self.client.containers.get(api.create_container(**args)["Id"])

    def run(self, command: str, timeout: float | None = None, channel: bool = False) -> CommandResult:
        if self.container is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        import docker

        oom, api = OomWatch(self._memory), self.client.api
        # the note lines after the cut output; the channel as the local sandbox keeps it
        caps = [self.config.max_output_bytes + 4096, self.config.max_file_mb * 1024 * 1024]
        received = [bytearray(), bytearray()]  # stdout (the output), stderr (the channel)
        try:
            exec_id = api.exec_create(self.container.id, self.exec_command(command, timeout, channel),
                                      workdir=self.config.docker_workdir, user=self.config.docker_user)["Id"]
            for chunks in api.exec_start(exec_id, stream=True, demux=True):  # as the engine relays them
                for chunk, kept, cap in zip(chunks, received, caps):
                    if chunk and len(kept) < cap:
                        kept += chunk[: cap - len(kept)]
            exit_code = api.exec_inspect(exec_id)["ExitCode"]
        except docker.errors.DockerException as e:
            raise SandboxError(f"the container could not run the command: {self._state()} ({e})") from e
        output = received[0].decode("utf-8", errors="replace")
        sent = bytes(received[1]) if channel else None
        verdict = oom.verdict(killed=exit_code in (None, 128 + 9))
        if verdict == "machine":
            raise SandboxError("the machine ran out of memory while the container ran the command (the kernel's OOM "
                               "killer ended a process; the container's own limit was not reached)")
        # was the command's end the container's? Asked after every command, whatever its exit code (a container
        # killed from outside once ended a test run with an ordinary one, graded as a run that ended early: a 0),
        # and, after a signal's, again for a few seconds: the engine can learn of the kill after the command ended
        state = self._state()
        for _ in range(SETTLE_CHECKS if exit_code is None or exit_code >= 128 else 0):
            if state != "running":
                break
            time.sleep(0.2)
            state = self._state()
        if state != "running":
            raise SandboxError(f"the container stopped while it ran the command: {state}")
        if verdict == "limit":
            end = "\n" if output and not output.endswith("\n") else ""
            return CommandResult(f"{output}{end}{out_of_memory_note(self.config.memory_mb)}\n", 128 + 9,
                                 out_of_memory=True, channel=sent)
        return CommandResult(output, exit_code, timed_out=exit_code == 124, channel=sent)

    def _state(self) -> str:
        """'running', or what the engine says of a container that is not (its exit, OOM kill), or that it is gone."""
        import docker

        try:
            self.container.reload()
        except docker.errors.DockerException as e:
            return f"gone ({e})"
        state = self.container.attrs.get("State", {})
        # a container being removed (auto_remove after its PID 1 died) can still say Running, with Pid 0
        running = state.get("Running") and state.get("Status") == "running"
        local = self.client.api.base_url.startswith("http+docker://")  # a Unix socket: the engine's processes are ours
        if running and local and not _alive(state.get("Pid", 0)):
            # the engine learns of its PID 1's death from an event that can come after the command returned
            return f"killed (its PID 1, {state.get('Pid')} on the host, is gone; the engine has not noticed yet)"
        if running:
            return "running"
        return f"{state.get('Status')}, exit code {state.get('ExitCode')}, OOM-killed {state.get('OOMKilled')}"

    def _exec(self, argv: list[str], stdin=None, cap: int = 1 << 16) -> tuple[int, bytes, bytes]:
        """Run `argv` in the container as its root, outside the commands' limits (the sandbox's own copies and
        transfers, not the agent's), within COPY_TIMEOUT, feeding it the chunks of bytes `stdin` (then end of file);
        returns its exit code and the first `cap` bytes of its stdout and of its stderr. The container not running,
        or the engine failing, is SandboxError."""
        import socket

        import docker
        from docker.utils.socket import frames_iter

        api = self.client.api
        try:
            exec_id = api.exec_create(self.container.id, ["timeout", "-k", "5", str(COPY_TIMEOUT), *argv],
                                      stdin=stdin is not None, user="0")["Id"]
            sock = api.exec_start(exec_id, socket=True)
            received = [bytearray(), bytearray()]
            try:
                # the stream's socket, through a descriptor of its own: sent whole, then half-closed (end of file)
                with socket.socket(fileno=os.dup(sock.fileno())) as writer:
                    writer.settimeout(COPY_TIMEOUT + 30)
                    try:
                        for chunk in stdin or ():
                            writer.sendall(chunk)
                        writer.shutdown(socket.SHUT_WR)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # it stopped reading (tar out of space): its exit code and errors say why
                for stream, data in frames_iter(sock, tty=False):
                    kept = received[stream == 2]
                    kept += data[: max(cap - len(kept), 0)]
            finally:
                sock.close()
            code = api.exec_inspect(exec_id)["ExitCode"]
        except (docker.errors.DockerException, OSError) as e:
            raise SandboxError(f"the container could not run {argv[0]}: {self._state()} ({e})") from e
        if code is None:
            raise SandboxError(f"the container did not finish {argv[0]}: {self._state()}")
        return code, bytes(received[0]), bytes(received[1])

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
        """Write `full` in the container (its folders made), owned by its root, as a file of its own: a link or a
        FIFO there is replaced, never followed or opened. Through `tar` in the container: the engine's archive
        calls do not reach its tmpfs mounts."""
        if self.container is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        data = text.encode("utf-8")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(full))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        folder = shlex.quote(posixpath.dirname(full))
        code, _, errors = self._exec(["/bin/sh", "-c", f"mkdir -p -- {folder} && tar -x -C {folder} -f -"],
                                     [buf.getvalue()])
        if code != 0:
            raise SandboxError(f"could not write {full} into the container: {errors.decode(errors='replace')}")

    def write_file(self, path: str, text: str) -> None:
        self._put(self._container_path(path), text)

    def write_scratch(self, name: str, text: str) -> str:
        full = posixpath.join(self.scratch_dir, posixpath.basename(name))
        self._put(full, text)
        return full

    def read_scratch(self, name: str) -> str | None:
        """Read in the container (`cat`; the engine's archive calls do not reach its tmpfs mounts), at most
        `max_file_mb`; a link, a FIFO or anything else but a regular file is None, never followed or opened. A
        container that is no longer running is SandboxError (it runs until `close`: a command's `kill -9 -1`
        spares its PID 1)."""
        if self.container is None:
            raise SandboxError("the sandbox is not started: call start(task) first")
        full = shlex.quote(posixpath.join(self.scratch_dir, posixpath.basename(name)))
        code, text, _ = self._exec(["/bin/sh", "-c", f"[ -f {full} ] && [ ! -L {full} ] || exit 3; cat -- {full}"],
                                   cap=self.config.max_file_mb * 1024 * 1024)
        if code == 3:
            return None
        if code != 0:
            raise SandboxError(f"could not read {full} in the container: {self._state()}")
        return text.decode("utf-8", errors="replace")

    def close(self) -> None:
        self._close_lifeline()
        if self.container is not None:
            _remove_quietly(self.container)
            self.container, self._memory = None, None
        if self._cpu_lease is not None:  # after the container: its processes have ended
            self._cpu_lease.release()
            self._cpu_lease, self.cpus = None, None

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None


def _alive(pid: int) -> bool:
    """Whether this machine's process `pid` (a container's PID 1, as its engine reports it) still runs: neither gone
    nor a zombie. True where it cannot be told (no pid, a process psutil may not inspect)."""
    if pid <= 0:
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _remove_quietly(container) -> None:
    try:
        container.remove(force=True, v=True)  # with its anonymous volumes (its /dev/pts)
    except Exception:
        pass  # already gone; nothing else to release
