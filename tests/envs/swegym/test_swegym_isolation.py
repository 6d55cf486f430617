"""Nothing one SWE-Gym sandbox writes reaches another sandbox or the host, on the local (bubblewrap) and the Docker
backend: one test per channel class, each with several variants. A first sandbox writes (or tries to); a second
sandbox of the same task, and the host, read nothing; and nothing is left in the host kernel.

Each probe also proves it is not vacuous: where the write is refused (the kernel keyring), the same call is shown to
work on the host in a throw-away session keyring; where it succeeds inside the sandbox (SysV IPC, POSIX queues,
sockets, files), the first sandbox reads its own write back.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from docker_engine import docker_client

from trl_multiturn.envs.swegym import SandboxConfig, make_sandbox, task_rows
from trl_multiturn.envs.swegym.sandbox.docker import OUTPUT_DIR
from trl_multiturn.envs.swegym.sandbox.seccomp import ARCHES, DENIED

ROW = next(row for row in task_rows() if row["repo"].endswith("/roman"))
COLUMN = ARCHES[platform.machine()][0]
NR = {name: numbers[COLUMN] for name, numbers in DENIED.items()}


@pytest.fixture(scope="module", params=["local", "docker"])
def pair(request, swegym_cache_dir):
    """Two started sandboxes of the same task on one backend."""
    if request.param == "docker":
        docker_client()
    config = SandboxConfig(sandbox=request.param, repo_cache_dir=swegym_cache_dir, command_timeout=60,
                           max_processes=64)
    with make_sandbox(config) as first, make_sandbox(config) as second:
        first.start(ROW)
        second.start(ROW)
        yield first, second


@pytest.fixture
def marker():
    return f"trlmt{uuid.uuid4().hex[:12]}"


def python(sandbox, script: str) -> str:
    result = sandbox.run(f"python - <<'EOF'\n{script}\nEOF")
    assert result.exit_code == 0, result.output
    return result.output


LIBC = "import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
KEYS = LIBC + f"""
def add_key(name, keyring):
    key = libc.syscall({NR['add_key']}, b"user", name.encode(), b"payload", 7, keyring)
    return key if key >= 0 else -ctypes.get_errno()
def find_key(name):
    key = libc.syscall({NR['request_key']}, b"user", name.encode(), None, 0)
    return key if key >= 0 else -ctypes.get_errno()
"""


def test_kernel_keyring(pair, marker):
    """Variants: the session, user, process and user-session keyrings; a lookup from a second sandbox."""
    first, second = pair
    rings = {"session": -3, "user": -4, "process": -2, "user-session": -5}
    out = python(first, KEYS + "".join(f"print(add_key('{marker}-{name}', {ring}))\n" for name, ring in rings.items()))
    assert out.split() == [str(-1)] * len(rings)  # EPERM: the seccomp filter (Docker's profile, or ours)
    found = python(second, KEYS + "".join(f"print(find_key('{marker}-{name}'))\n" for name in rings))
    assert all(int(code) < 0 for code in found.split())
    assert marker not in Path("/proc/keys").read_text()
    # not vacuous: the same call adds a key on the host, in a session keyring of its own that dies with its process
    host = subprocess.run(["python3", "-c", KEYS + f"libc.syscall({NR['keyctl']}, 1, None)\n"
                           f"print(add_key('{marker}-host', -3) > 0)"], capture_output=True, text=True)
    assert host.stdout.split() == ["True"], host.stderr


SYSV = LIBC + """
key = {key}
made = [libc.shmget(key, 4096, {flags}), libc.semget(key, 1, {flags}), libc.msgget(key, {flags})]
print(*[('made' if m >= 0 else 'none:' + errno.errorcode[ctypes.get_errno()]) for m in made])
"""


def _ipcs() -> str:
    return subprocess.run(["ipcs"], capture_output=True, text=True, check=True).stdout


def test_sysv_ipc(pair):
    """Variants: a shared memory segment, a semaphore set and a message queue under one key; read back in the
    same command, looked up from the next command and from a second sandbox, and in the host's `ipcs`."""
    first, second = pair
    key = int(uuid.uuid4().hex[:7], 16)
    create = SYSV.format(key=key, flags="0o1666")  # IPC_CREAT | 0666
    lookup = SYSV.format(key=key, flags="0")
    made = python(first, create + lookup)
    assert made.splitlines() == ["made made made"] * 2  # the first sandbox has its own, and sees it
    assert python(second, lookup).split() == ["none:ENOENT"] * 3
    assert f"0x{key:08x}" not in _ipcs()


MQUEUE = LIBC + """
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
def mq(name, flags):
    fd = libc.mq_open(name.encode(), flags, 0o666, None)
    return 'open' if fd >= 0 else 'none:' + errno.errorcode[ctypes.get_errno()]
"""


def test_posix_message_queues_and_dev_shm(pair, marker):
    """Variants: a POSIX message queue, a file, a FIFO and a shm_open segment in /dev/shm."""
    first, second = pair
    write = MQUEUE + (f"print(mq('/{marker}', os.O_CREAT | os.O_RDWR), mq('/{marker}', os.O_RDONLY))\n"
                      f"open('/dev/shm/{marker}', 'w').write('x'); os.mkfifo('/dev/shm/{marker}.fifo')\n"
                      f"print(sorted(n for n in os.listdir('/dev/shm') if n.startswith('{marker}')))")
    assert python(first, write).splitlines() == ["open open", str([marker, f"{marker}.fifo"])]
    read = MQUEUE + f"print(mq('/{marker}', os.O_RDONLY), sorted(os.listdir('/dev/shm')))"
    assert python(second, read).strip() == "none:ENOENT []"
    host = subprocess.run(["python3", "-c", read], capture_output=True, text=True)
    assert host.stdout.startswith("none:ENOENT") and not list(Path("/dev/shm").glob(f"{marker}*"))


LISTENER = """
import os, socket, time
servers = [socket.socket(socket.AF_UNIX), socket.socket()]
servers[0].bind('\\0{marker}')
servers[1].bind(('127.0.0.1', {port}))
for s in servers:
    s.listen()
# not vacuous: a client in the same sandbox command connects
socket.socket(socket.AF_UNIX).connect('\\0{marker}')
socket.create_connection(('127.0.0.1', {port}), 5)
print(*['self' for s in servers if s.accept()])
for s in servers:
    s.setblocking(False)
open('/tmp/swegym/{marker}.bound', 'w').close()
while not os.path.exists('/tmp/swegym/{marker}.stop'):
    for s in servers:
        try:
            s.accept()
            print('accepted')
        except BlockingIOError:
            pass
    time.sleep(0.01)
print('stopped')
"""

CONNECT = """
import socket
for family, address in [(socket.AF_UNIX, '\\0{marker}'), (socket.AF_INET, ('127.0.0.1', {port}))]:
    try:
        socket.create_connection(address, 5) if family == socket.AF_INET else socket.socket(family).connect(address)
        print('connected')
    except OSError as e:
        print('refused', type(e).__name__)
"""


def test_sockets_left_listening(pair, marker):
    """Variants: an abstract unix socket and a loopback TCP port, listening while a second sandbox and the host
    connect; then a listener started in the background, which must not outlive its command."""
    first, second = pair
    with socket.socket() as probe:  # a port nothing listens on, on the host
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = LISTENER.format(marker=marker, port=port)
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=first.run(f"python - <<'EOF'\n{listener}\nEOF")))
    thread.start()
    try:
        # through the scratch folder, read and written without a command (a Docker command ends every process of
        # its container, the listener's too)
        _wait_for(lambda: first.read_scratch(f"{marker}.bound") is not None or not thread.is_alive())
        assert thread.is_alive(), result  # the listener's command ended before it bound
        connect = CONNECT.format(marker=marker, port=port)
        assert python(second, connect).split() == ["refused", "ConnectionRefusedError"] * 2
        host = subprocess.run(["python3", "-c", connect], capture_output=True, text=True)
        assert host.stdout.split() == ["refused", "ConnectionRefusedError"] * 2, host.stdout
    finally:
        first.write_scratch(f"{marker}.stop", "")
        thread.join()
    assert result["out"].output.split() == ["self", "self", "stopped"]  # nothing from outside was accepted
    # a listener left in the background, double-forked out of the command's session
    bound = f"/tmp/swegym/{marker}.bound"
    first.run(f"rm -f {bound}; (setsid python - >/dev/null 2>&1 <<'EOF' &\n{listener}\nEOF\n); "
              f"until [ -e {bound} ]; do sleep 0.01; done")  # the command ends with its listener bound
    assert python(first, connect).split() == ["refused", "ConnectionRefusedError"] * 2


def test_files_in_every_writable_folder(pair, marker):
    """Variants: a file in each folder the sandbox may write (found by walking its file system), extended
    attributes and timestamps on the shared read-only folders, a ~/.bashrc for the next shell."""
    first, second = pair
    walk = (
        "import os, sys\nfound = []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    if root.startswith(('/proc', '/sys', '/dev/pts')):\n        dirs[:] = []\n        continue\n"
        "    if os.access(root, os.W_OK):\n        found.append(root)\n"
        f"for folder in found:\n    open(os.path.join(folder, '{marker}'), 'w').write('x')\n"
        "print(len(found), *[f for f in found if not f.startswith(('/testbed', '/tmp'))][:50])"
    )
    wrote = python(first, walk).split()
    writable = wrote[1:]
    assert int(wrote[0]) >= 2  # at least the checkout and /tmp
    if first.config.sandbox == "local":
        assert set(writable) <= {"/dev/shm"}, writable  # only the checkout, /tmp and /dev/shm are writable
    else:  # the image's files read-only (wave 11): the writable folders are tmpfs mounts of the container's own
        assert [w for w in writable if not w.startswith(("/root", "/var/tmp", "/dev", OUTPUT_DIR))] == [], writable
    first.run(f"echo 'echo {marker}' >> ~/.bashrc")
    shared = ["/usr/bin/env", "/etc/hostname", "/usr/lib"]
    before = {p: os.stat(p).st_mtime_ns for p in shared}
    tried = first.run("for p in " + " ".join(shared) + "; do touch -d 2001-01-01 $p 2>/dev/null && echo changed $p; "
                      f"python -c \"import os; os.setxattr('$p', 'user.{marker}', b'1')\" 2>/dev/null && echo "
                      "changed $p; done")
    assert "changed" not in tried.output, tried.output  # Docker: a read-only root since wave 11
    assert {p: os.stat(p).st_mtime_ns for p in shared} == before  # the host's files are untouched
    search = second.run(f"find / \\( -path /proc -o -path /sys \\) -prune -o -name '{marker}*' -print 2>/dev/null; "
                        "bash -ic true 2>/dev/null; echo end", timeout=600)
    assert search.output.split() == ["end"], search.output
    assert not [p for p in ("/tmp", "/var/tmp", "/dev/shm", "/root") if list(Path(p).glob(f"{marker}*"))]
    assert not any(os.getxattr(p, f"user.{marker}", follow_symlinks=False) for p in shared if _has_xattr(p, marker))


def test_descriptors_and_environment(pair, marker):
    """Variants: a host file opened inheritable by the trainer, the trainer's environment, a variable exported by
    one command for the next, and the descriptors bubblewrap itself was given."""
    first, second = pair
    secret = Path(f"/tmp/{marker}.secret")
    secret.write_text(marker)
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)
    os.environ[f"TRLMT_{marker}"] = marker
    try:
        fds = first.run("ls /proc/self/fd; for f in /proc/self/fd/*; do readlink $f; done; env; export LEAK=" + marker)
        listed = fds.output.split()
        assert listed[:4] == ["0", "1", "2", "3"] and "4" not in listed  # stdin, out, err and ls's own folder
        assert marker not in fds.output
        again = first.run("env; ls /proc/self/fd")
        assert marker not in again.output and "LEAK" not in again.output
        assert marker not in second.run("env; cat /proc/1/environ 2>/dev/null").output
    finally:
        os.close(fd)
        secret.unlink()
        del os.environ[f"TRLMT_{marker}"]


def test_processes_proc_sys_and_cgroups(pair, marker):
    """Variants: processes left in the background (nohup, setsid, a double fork) trying to outlive the command;
    writes to /proc/sys (namespaced and not); writes to cgroup files."""
    first, second = pair
    sleeps = [f"sleep {1000 + int(marker[-3:], 16) + i}" for i in range(3)]
    first.run(f"nohup {sleeps[0]} >/dev/null 2>&1 & setsid {sleeps[1]} & ({sleeps[2]} &)")
    left = first.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").output
    assert not [s for s in sleeps if s in left], left
    assert not [s for s in sleeps if _host_processes(s)]
    namespaced = ["kernel/shmmax", "fs/mqueue/msg_max"]  # the sandbox's own IPC namespace's: it may set them
    sysctl = [*namespaced, "kernel/domainname", "kernel/core_pattern", "vm/overcommit_memory", "kernel/hostname"]
    before = {p: Path("/proc/sys", p).read_text() for p in sysctl}
    wrote = first.run("for p in " + " ".join(sysctl) + "; do { echo 7 > /proc/sys/$p; } 2>/dev/null && echo $p; done; "
                      "for f in $(find /sys/fs/cgroup -maxdepth 2 -name '*.max' -o -maxdepth 2 -name "
                      "'memory.limit_in_bytes' 2>/dev/null); do { echo 1 > $f; } 2>/dev/null && echo $f; done")
    assert set(wrote.output.split()) <= set(namespaced), wrote.output
    assert {p: Path("/proc/sys", p).read_text() for p in sysctl} == before  # the host's values
    seen = second.run("for p in " + " ".join(sysctl) + "; do cat /proc/sys/$p; done").output
    # a second sandbox sees the defaults, not the first one's values (and a host name of its own)
    assert seen.splitlines()[:-1] == "".join(before.values()).splitlines()[:-1] and seen.splitlines()[-1] != "7"


def _wait_for(condition, deadline_s: float = 600) -> None:
    """Poll `condition` until it holds (the deadline only tells a listener that never started from a slow one)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the listener never said it was bound")
        time.sleep(0.02)


def _has_xattr(path: str, marker: str) -> bool:
    try:
        return f"user.{marker}" in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False


def _host_processes(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes().replace(b"\0", b" "):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_nothing_left_in_the_host_kernel(pair):
    """After the channel tests: the sandboxes' SysV objects and keys are nowhere in the host's kernel."""
    first, second = pair
    for sandbox in (first, second):
        python(sandbox, SYSV.format(key=0x7E57, flags="0o1666"))
    assert "0x00007e57" not in _ipcs()
    assert socket.gethostname() != "sandbox"


# Local only: Docker's profile is made from the same tables (seccomp.docker_profile) but leaves `personality` free and
# kills a call of another ABI (x32) instead of refusing it; test_kernel_keyring and test_swegym_kernel_channels.py
# check its calls
@pytest.mark.parametrize("pair", ["local"], indirect=True)
def test_the_seccomp_filter_refuses_every_listed_call(pair):
    """Local: each call of `seccomp.DENIED` fails with EPERM, whatever its arguments (zeros here: unfiltered, most
    would fail otherwise, with EINVAL, EFAULT or EBADF, or succeed); `clone3` and x32 calls with ENOSYS; `clone`
    with a namespace flag with EPERM while a plain fork works; `personality` beyond Docker's values refused."""
    first, _ = pair
    from trl_multiturn.envs.swegym.sandbox.seccomp import CLONE, CLONE3, PERSONALITY

    numbers = {name: nr for name, nr in NR.items() if nr is not None}
    script = LIBC + f"""
numbers = {numbers!r}
def call(nr, *args):
    result = libc.syscall(nr, *(args or (0, 0, 0, 0, 0, 0)))
    return 'ok' if result >= 0 else errno.errorcode[ctypes.get_errno()]
print(sorted({{call(nr) for nr in numbers.values()}}))
child = os.fork()  # a plain clone (SIGCHLD only)
if child == 0:
    os._exit(0)
print(call({CLONE3[COLUMN]}), call({CLONE[COLUMN]}, 0x10000000 | 17, 0, 0, 0, 0), os.waitpid(child, 0)[1])
print(call({PERSONALITY[COLUMN]}, 0xFFFFFFFF), call({PERSONALITY[COLUMN]}, 0x0006))
print(call(0x40000000 | 39) if {COLUMN} == 0 else 'ENOSYS')
print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])
"""
    lines = python(first, script).splitlines()
    assert lines == ["['EPERM']", "ENOSYS EPERM 0", "ok EPERM", "ENOSYS", "2"], lines
