"""What a SWE-Gym sandbox contains, tried from inside it as an agent would, on the local (bubblewrap) and the
Docker backend: the answer key, the network, the host's files and processes, capabilities, shared /tmp."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from docker_engine import docker_client

from trl_multiturn.envs.swegym import SandboxConfig, make_sandbox, task_rows
from trl_multiturn.envs.swegym.sandbox import CHANNEL_FD
from trl_multiturn.envs.swegym.sandbox.base import OOM_SCORE_ADJ
from trl_multiturn.envs.swegym.sandbox.bwrap import bwrap_argv
from trl_multiturn.envs.swegym.sandbox.rootfs import copy_root, ensure_root

ROWS = {row["repo"].split("/")[1]: row for row in task_rows()}
# Test names that only the hidden test patches hold (the distinctive ones: `test_round_trip` is in the standard
# library's own tests): finding one anywhere means the answer key is readable.
HIDDEN = sorted({name for row in ROWS.values() for test in row["FAIL_TO_PASS"]
                 if len((name := test.split("::")[-1]).split("_")) >= 4})
SEARCH_TIMEOUT_S = 600  # a `find /` takes seconds; under load, many times that, never this


@pytest.fixture(params=["local", "docker"])
def config(request, swegym_cache_dir):
    if request.param == "docker":
        docker_client()
    return SandboxConfig(sandbox=request.param, repo_cache_dir=swegym_cache_dir, command_timeout=20, max_processes=64)


@pytest.fixture
def sandbox(config):
    with make_sandbox(config) as box:
        box.start(ROWS["roman"])
        yield box


def test_the_hidden_tests_exist_only_in_the_task_rows():
    assert HIDDEN and all(name not in text for row in ROWS.values() for name in HIDDEN
                          for text in (row["problem_statement"],))


def test_the_answer_key_is_out_of_reach(sandbox):
    imported = sandbox.run("python -c 'import trl_multiturn'")
    assert imported.exit_code != 0 and "No module named 'trl_multiturn'" in imported.output
    # whole-filesystem searches: a limit no loaded machine reaches, and a cut search fails loudly, never vacuously
    found = sandbox.run(
        "find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o \\( -name 'trl_multiturn*' -o -path "
        "'*/envs/swegym/tasks*' -o -name '*.egg-link' \\) -print 2>/dev/null; echo end", timeout=SEARCH_TIMEOUT_S
    )
    assert not found.timed_out, f"find / ran past {SEARCH_TIMEOUT_S} s: {found.output[-300:]}"
    assert found.output == "end\n"
    places = "$(python -c 'import sys; print(*[p for p in sys.path if p])') \"$HOME\" /tmp /testbed"
    grep = sandbox.run(f"grep -rlsE '{'|'.join(HIDDEN)}' {places}; echo end", timeout=SEARCH_TIMEOUT_S)
    assert not grep.timed_out, f"grep ran past {SEARCH_TIMEOUT_S} s: {grep.output[-300:]}"
    assert grep.output == "end\n"
    environment = sandbox.run("env; cat /proc/1/environ /proc/1/cmdline 2>/dev/null | tr '\\0' '\\n'").output
    assert os.environ["PYTEST_CURRENT_TEST"]  # set in this (the trainer's) process, and kept out of the sandbox
    assert not any(name in environment for name in ("PYTEST_CURRENT_TEST", "HF_HUB_OFFLINE", "PYTHONPATH"))


def test_what_a_command_sent_on_the_channel_cannot_be_taken_back(sandbox):
    """Grading's report travels on the channel, not in a file of a folder the sandbox user may write (which a test
    run could replace whole). What was written reaches the host in order, more than a pipe holds included;
    reopening it to truncate is refused or truncates nothing, closing it loses nothing sent, a process left behind
    is ended with the command; a command run without it gets none."""
    fd = CHANNEL_FD
    sent = sandbox.run(f"printf 'first\\n' >&{fd}; head -c 200000 /dev/zero | tr '\\0' x >&{fd}; "
                       f"{{ : > /proc/self/fd/{fd}; }} 2>/dev/null; printf 'last\\n' >&{fd}; "
                       f"(sleep 2; echo late >&{fd}) & exec {fd}>&-; echo done", channel=True)
    assert sent.output == "done\n" and sent.exit_code == 0
    assert sent.channel == b"first\n" + b"x" * 200000 + b"last\n"
    plain = sandbox.run(f"echo none >&{fd}; echo $?")
    assert plain.channel is None and plain.output.strip().endswith("1")  # no such descriptor


def test_no_network_not_even_the_hosts_loopback(sandbox):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        probe = sandbox.run(
            "python - <<'EOF'\nimport socket\nprint(sorted(name for _, name in socket.if_nameindex()))\n"
            f"for address in [('127.0.0.1', {port}), ('151.101.2.132', 80), ('deb.debian.org', 80)]:\n"
            "    try:\n        socket.create_connection(address, timeout=3)\n        print('connected', address)\n"
            "    except OSError as e:\n        print('refused', type(e).__name__)\nEOF"
        )
    assert "connected" not in probe.output and probe.output.count("refused") == 3, probe.output
    assert probe.output.splitlines()[0] == "['lo']"


def test_no_capabilities_and_no_host_files(sandbox, config):
    status = sandbox.run("grep -E '^Cap(Eff|Prm|Amb)' /proc/self/status; cat /proc/self/oom_score_adj; "
                         "touch own && chown 12345 own; echo $?")
    assert [line.split()[1] for line in status.output.splitlines()[:3]] == ["0000000000000000"] * 3
    # a machine-level OOM kills the sandbox's processes before the trainer (before: 0 locally, the trainer's own)
    assert status.output.splitlines()[3] == str(OOM_SCORE_ADJ)
    # refused: EPERM without CAP_CHOWN; EINVAL in the local sandbox's user namespace, where uid 12345 has no mapping
    assert "changing ownership of 'own'" in status.output and status.output.splitlines()[-1] == "1"
    probe = sandbox.run("ls /proc | grep -cE '^[0-9]+$'; ls /root /work /home 2>&1 | head -5")
    assert int(probe.output.split()[0]) < 10  # only the sandbox's own processes
    if config.sandbox == "local":  # Docker's root may write its own container's files, which go with it
        writes = sandbox.run("for p in /usr/x /etc/x /x /proc/x; do touch $p 2>&1; done; cat /etc/shadow 2>&1")
        # the host's /etc is not there: the sandbox's root holds a few files of it, never the password hashes
        assert writes.output.count("Read-only file system") == 3 and "/etc/shadow: No such file" in writes.output
        assert not any(Path(p).exists() for p in ("/usr/x", "/etc/x", "/x"))


def test_processes_and_tmp_are_private(config):
    marker = f"swegym-marker-{os.getpid()}"
    with subprocess.Popen(["sleep", "300"]) as bystander:
        with make_sandbox(config) as first, make_sandbox(config) as second:
            first.start(ROWS["roman"])
            second.start(ROWS["ledger"])
            first.run("sleep 100 & kill -9 -1")
            assert bystander.poll() is None  # kill(-1) reached nothing outside the sandbox, nor its container
            made = first.run(f"echo {marker} > /tmp/{marker}; echo {marker} > /dev/shm/{marker}; ls /tmp/{marker}")
            assert made.output == f"/tmp/{marker}\n"
            assert second.run(f"ls /tmp/{marker} /dev/shm/{marker} 2>&1 | grep -c 'No such'").output.strip() == "2"
            assert not (Path(tempfile.gettempdir()) / marker).exists()
            flood = first.run("python -c \"\nimport os, time\nfor i in range(300):\n    if os.fork() == 0:\n"
                              "        time.sleep(30)\n        os._exit(0)\n\"")
            assert flood.exit_code != 0 and "Resource temporarily unavailable" in flood.output
        bystander.kill()


def test_an_unprivileged_user_gets_the_same_namespaces(swegym_cache_dir):
    """bubblewrap as an ordinary user (no setuid, a user namespace of its own), on a private root."""
    user = 65534 if os.geteuid() == 0 else os.geteuid()
    checkout = Path(tempfile.mkdtemp(prefix="swegym-user-"))
    own_tmp = checkout / "tmp"
    own_tmp.mkdir()
    for folder in (checkout, own_tmp):
        os.chown(folder, user, user)
    root = Path(tempfile.mkdtemp(prefix="swegym-root-"))  # the cache folder is the trainer's alone (0700)
    root.chmod(0o755)
    copy_root(ensure_root(Path(swegym_cache_dir), [], []), root)
    argv = bwrap_argv(checkout=str(checkout), tmp=str(own_tmp), workdir="/testbed", python_dirs={}, hidden=[],
                      env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, shm_bytes=1 << 20, proc_views={}, root=str(root))
    script = ("id -u; touch /testbed/written /tmp/own && echo wrote; ls /root 2>&1 | head -1; "
              "awk -F: 'NR > 2 {printf \"%s \", $1}' /proc/net/dev | tr -s ' '; echo")
    become = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if os.geteuid() == 0 else []
    done = subprocess.run([*become, *argv, "/bin/bash", "-c", script], capture_output=True, text=True, timeout=60)
    try:
        lines = done.stdout.splitlines()
        assert lines[:2] == [str(user), "wrote"] and lines[-1].split() == ["lo"], (done.stdout, done.stderr)
        assert "cannot access '/root'" in lines[2]
        assert (checkout / "written").exists() and (own_tmp / "own").exists()
    finally:
        subprocess.run(["rm", "-rf", str(checkout), str(root)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="as an ordinary user the command runs as that user: no uid to take")
def test_a_local_command_holds_only_the_sandbox_uid(swegym_cache_dir):
    """Seen from the host while it runs: bubblewrap (the command's outermost process) has the sandbox uid as its real,
    effective and saved uid and gid and no supplementary group, so nothing inside can take root's ids back."""
    import threading

    import psutil

    config = SandboxConfig(sandbox="local", repo_cache_dir=swegym_cache_dir, command_timeout=600)
    groups = os.getgroups()
    os.setgroups([*groups, 4242])  # a supplementary group of the trainer's, which the command must not keep
    with make_sandbox(config) as box:
        box.start(ROWS["roman"])
        done = {}
        thread = threading.Thread(target=lambda: done.update(out=box.run(
            "touch /tmp/swegym/running; until [ -e /tmp/swegym/stop ]; do sleep 0.05; done; echo stopped")))
        thread.start()
        try:
            while box.read_scratch("running") is None and thread.is_alive():
                thread.join(0.05)
            assert thread.is_alive(), done
            bwrap = [p for p in psutil.Process().children() if p.name() == "bwrap"]
            assert len(bwrap) == 1
            lines = Path(f"/proc/{bwrap[0].pid}/status").read_text().splitlines()
            status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        finally:
            box.write_scratch("stop", "")
            thread.join()
            os.setgroups(groups)
        assert status["Uid"].split() == [str(box.uid)] * 4 and status["Gid"].split() == [str(box.uid)] * 4
        assert status["Groups"].strip() == "" and box.uid != 0  # not 4242
        assert done["out"].output == "stopped\n"


@pytest.mark.parametrize("path", ["node", "/no/such/program"])
def test_root_extra_that_is_no_host_path_is_refused_when_built(path):
    with pytest.raises(ValueError, match=f"root_extra: '{path}' is no absolute path of a file or folder on this "
                                         "machine; give the absolute path"):
        SandboxConfig(root_extra=[path])
