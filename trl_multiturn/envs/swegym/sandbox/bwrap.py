"""The bubblewrap command line that confines one local sandbox command.

A pure function of the sandbox's layout, so what a command can see is readable in one place (and testable):
its own user, network, PID, IPC, UTS, cgroup and mount namespaces; /usr and /etc read-only (the sandbox's private
copy of a minimal root, `rootfs.py`, whose pages no other sandbox reads); the task Python read-only (from the same
copy) with every site-packages folder of the trainer masked; the checkout at `workdir`; a /tmp of its own; a
fresh /proc and /dev with a private /dev/shm and, as root, a /dev/pts of at most `containment.MAX_PTYS` ptys;
everything else read-only. bubblewrap runs unprivileged, as the
sandbox's uid (as root, the caller switches to it first), and makes a user namespace that maps that uid to itself,
where the command has no capability; the seccomp filter keeps it from making another (not `--disable-userns`:
the nested user namespace that option makes clears the init's parent-death signal, and a killed driver would leave
the namespace running). The seccomp
filter (`seccomp.py`, `--seccomp`, added per command by the caller) denies what could reach outside these
namespaces (the kernel keyring, other processes, mounts, new namespaces, io_uring, page-cache residency, locks and
watches on shared files...); the machine's memory statistics under /proc are replaced by a fixed view
(`procview.py`). bubblewrap's own init is the
PID namespace's PID 1 and dies with bubblewrap (`--die-with-parent`); when it dies the kernel kills everything else
in the namespace.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .base import SandboxError

# Top-level folders that are symlinks into /usr on merged-/usr systems (Debian 12), real folders elsewhere.
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def find_program(name: str, purpose: str, otherwise: str = "") -> str:
    """The path of the program `name` the local sandbox runs its commands through (`purpose` says what for;
    `otherwise`, the alternative to installing it)."""
    path = shutil.which(name) or next((p for p in (f"/usr/bin/{name}", f"/usr/sbin/{name}") if os.access(p, os.X_OK)),
                                      None)
    if path is None:
        raise SandboxError(
            f"the local sandbox needs `{name}` ({purpose}): install it (Debian: apt-get install bubblewrap "
            f"util-linux; scripts/setup.sh does so as root){otherwise}"
        )
    return path


def _covered(path: Path, mounts: list[Path]) -> bool:
    return any(path == m or m in path.parents for m in mounts)


def bwrap_argv(
    *,
    checkout: str,
    tmp: str,
    workdir: str,
    python_dirs: dict[Path, Path],
    hidden: list[Path],
    env: dict[str, str],
    shm_bytes: int,
    proc_views: dict[str, str],
    root: str,
    pts: str | None = None,
) -> list[str]:
    """The argv prefix (a command and its arguments follow) that runs a command in the sandbox.

    `checkout` (host) appears read-write at `workdir`, `tmp` (host) read-write at /tmp; `python_dirs` (each folder
    with where bubblewrap finds it: a bind mount the sandbox uid can reach, `containment.PrivateSpace`) read-only
    at their own paths (with world-readable parent folders made for them); each of `hidden` that lies inside a
    visible folder is covered by an empty read-only tmpfs; each of `proc_views` ({file under /proc: host file}) is
    bound read-only over the machine's own (`procview.py`). `root` (where bubblewrap finds the sandbox's private
    copy of its root, `rootfs.py`) gives /usr, /etc and the top-level library folders in place of the host's; the
    `python_dirs` sources lie in it too. `pts`, if given, is a devpts instance bound at /dev/pts in place of the one
    bubblewrap makes (which has no `max`: `containment.MAX_PTYS`).
    """
    bwrap = find_program("bwrap", "bubblewrap, for isolation='bwrap'", ", or set isolation='none' to run commands "
                         "without isolation (see the SWE-Gym README for what that leaves open)")
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup", "--unshare-user", "--die-with-parent",
            "--new-session", "--hostname", "sandbox"]
    argv += ["--ro-bind", f"{root}/usr", "/usr", "--ro-bind", f"{root}/etc", "/etc"]
    for name in ROOT_LINKS:
        host = Path("/", name)
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():  # `rootfs.ensure_root` makes each in the root
            argv += ["--ro-bind", f"{root}{host}", str(host)]
    argv += ["--proc", "/proc"]
    for target, source in proc_views.items():
        argv += ["--ro-bind", source, target]
    argv += ["--dev", "/dev", "--perms", "1777", "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
             "--bind", tmp, "/tmp", "--bind", checkout, workdir]
    if pts is not None:  # /dev/ptmx is bubblewrap's link to pts/ptmx: this instance's
        argv += ["--dev-bind", pts, "/dev/pts"]
    same = [Path("/usr"), Path("/etc")]  # host folders seen at their own paths
    mounted = [*same, Path("/tmp"), Path(workdir)]
    made: set[Path] = set()  # parent folders made world-readable (bwrap would make them 0700)
    for folder, source in python_dirs.items():
        if _covered(folder, same):
            continue
        for parent in reversed(folder.parents):
            if parent not in made and parent not in mounted and not _covered(parent, same) and parent != Path("/"):
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        argv += ["--ro-bind", str(source), str(folder)]
        same.append(folder)
    for folder in sorted(set(hidden)):
        if folder.is_dir() and _covered(folder, same):
            argv += ["--tmpfs", str(folder), "--remount-ro", str(folder)]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", workdir, "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return [*argv, "--"]
