"""The files a local sandbox runs on: a minimal root of its own, never the host's /usr.

Every file a sandbox can read is a channel to the next sandbox if the next one reads the same inode: a page the
first reads stays in the kernel's page cache, and the second can time its read (issue 60; the SWE-Gym README's
attack table). So no sandbox sees a host file that another sandbox sees. A minimal root (what the tasks' commands
need: bash, coreutils and the usual text tools, git, the task's Python and its libraries, a few files of /etc, with
the shared libraries all of them load) is copied from the host once per machine into the cache folder
(`ensure_root`, under a name that hashes the path, size, mode and modification time of every file in it and this
module, so a change on the host or in the recipe builds a new one), and each sandbox gets a private copy of that
(`PrivateSpace` as root: a tmpfs in the sandbox's own mount namespace, read-only once copied; otherwise a folder
next to its checkout, removed with it), bound in place of the host's /usr, /etc and Python. Each copy is written
whole when its sandbox starts, so every page of it is cached whatever a sandbox does (a tmpfs page is always),
and no other sandbox ever reads it.
"""

from __future__ import annotations

import fcntl
import fnmatch
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .base import SandboxError
from .bwrap import ROOT_LINKS

# What the tasks' commands (and an agent's shell) run; those missing on the host are left out.
PROGRAMS = (
    "bash", "sh", "dash", "git",
    # coreutils
    "[", "arch", "base32", "base64", "basename", "cat", "chmod", "chown", "cksum", "comm", "cp", "csplit", "cut",
    "date", "dd", "df", "dirname", "du", "echo", "env", "expand", "expr", "factor", "false", "fmt", "fold", "groups",
    "head", "id", "install", "join", "link", "ln", "logname", "ls", "md5sum", "mkdir", "mkfifo", "mktemp", "mv",
    "nice", "nl", "nohup", "nproc", "numfmt", "od", "paste", "pathchk", "pr", "printenv", "printf", "ptx", "pwd",
    "readlink", "realpath", "rm", "rmdir", "seq", "sha1sum", "sha256sum", "sha512sum", "shuf", "sleep", "sort",
    "split", "stat", "stty", "sum", "sync", "tac", "tail", "tee", "test", "timeout", "touch", "tr", "true",
    "truncate", "tsort", "tty", "uname", "unexpand", "uniq", "unlink", "wc", "whoami", "yes",
    # text, files and processes
    "grep", "egrep", "fgrep", "sed", "awk", "mawk", "gawk", "find", "xargs", "diff", "cmp", "diff3", "sdiff", "patch",
    "tar", "gzip", "gunzip", "zcat", "which", "less", "more", "ps", "pgrep", "pkill", "kill", "tree", "jq",
    "rg", "make", "xz", "bzip2", "unzip", "zip",
    # util-linux
    "setsid", "getopt", "hostname", "column", "rev",
)
# Folders a program needs whole (git's subcommands and templates, the C.UTF-8 locale).
FOLDERS = ("/usr/lib/git-core", "/usr/share/git-core", "/usr/lib/locale/C.utf8")
ETC = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "hosts", "localtime")
# Parts of a Python's standard library no task command needs (packages, tests, GUIs; `config-*`, the static library).
STDLIB_SKIP = ("site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3")
# Files left out wherever they lie in a folder the root copies (fnmatch patterns of the name): optimised bytecode,
# Python's Tk module (it loads Tk and X11) and its test extension modules, git's network programs (commands have no
# network; they load curl and TLS).
SKIP = ("*.opt-1.pyc", "*.opt-2.pyc", "_tkinter.*.so", "_test*.so", "_ctypes_test.*.so", "_xxtestfuzz.*.so",
        "xxlimited*.so", "git-remote-http*", "git-remote-ftp*", "git-http-*", "git-imap-send", "git-daemon",
        "git-shell", "scalar")


def _normal(path: str) -> Path:
    """`path` with every link in its folders resolved (not in its last part): where the file itself lies."""
    path = os.path.abspath(path)
    return Path(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _chain(path: str) -> list[Path]:
    """`path` and every link it leads through, ending with the file or folder itself."""
    out, seen = [], set()
    here = _normal(path)
    while here not in seen:
        seen.add(here)
        out.append(here)
        if not here.is_symlink():
            break
        here = _normal(os.path.join(here.parent, os.readlink(here)))
    return out


def _skipped(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in SKIP)


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _libraries(binaries: list[Path]) -> set[Path]:
    """The shared libraries and the loader the ELF `binaries` load (ldd, one call for all)."""
    found: set[Path] = set()
    for start in range(0, len(binaries), 200):
        done = subprocess.run(["ldd", *map(str, binaries[start:start + 200])], capture_output=True, text=True)
        for line in done.stdout.splitlines():
            words = line.split()
            for word in words:
                if word.startswith("/") and not word.endswith(":"):
                    found.add(Path(word))
    return found


def _python_parts(folder: Path) -> list[Path]:
    """What of a Python installation or virtual environment `folder` the root copies: a virtual environment whole;
    of an installation, its interpreters, its shared library and its standard library but `STDLIB_SKIP`."""
    if (folder / "pyvenv.cfg").exists():
        return [folder]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    parts = [p for name in ("python", "python3", version) for p in [folder / "bin" / name] if p.exists()]
    parts += sorted((folder / "lib").glob("libpython3*.so*"))
    stdlib = folder / "lib" / version
    parts += [p for p in sorted(stdlib.iterdir()) if p.name not in STDLIB_SKIP and not p.name.startswith("config-")]
    return parts


@functools.cache
def root_files(python_dirs: tuple[Path, ...], extra: tuple[str, ...] = ()) -> tuple[Path, ...]:
    """Every host path the root holds (files, links, whole folders), normalised, sorted: `PROGRAMS` and `FOLDERS`
    found on the host, `ETC`, the parts of `python_dirs` (`_python_parts`), `extra` (host files or folders), and the
    libraries every ELF file among them loads. Once per process."""
    paths: set[Path] = set()
    for name in PROGRAMS:
        found = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if found:
            paths.update(_chain(found))
    for entry in (*FOLDERS, *(f"/etc/{name}" for name in ETC), *extra):
        if os.path.lexists(entry):
            paths.update(_chain(entry))
    for folder in python_dirs:
        for part in _python_parts(folder):
            paths.update(_chain(str(part)))
    binaries = []
    for path in sorted(paths):
        if path.is_dir() and not path.is_symlink():
            binaries += [Path(d, n) for d, _, names in os.walk(path) for n in names
                         if not _skipped(n) and _is_elf(Path(d, n))]
        elif path.is_file() and not path.is_symlink() and _is_elf(path):
            binaries.append(path)
    for library in _libraries(binaries):
        paths.update(_chain(str(library)))
    return tuple(sorted(paths))


@functools.cache
def _key(files: tuple[Path, ...], hidden: tuple[Path, ...]) -> str:
    """A hash of the path, size, mode and modification time of everything in the root, and of how it is built
    (this module), once per process."""
    digest = hashlib.sha256()
    for path in files:
        walk = [(path, [])] if not path.is_dir() or path.is_symlink() else [(Path(d), n) for d, _, n in os.walk(path)]
        for folder, names in walk:
            for item in [folder, *(folder / n for n in sorted(names))]:
                stat = item.lstat()
                digest.update(f"{item}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_mode}\n".encode())
    digest.update("\n".join(map(str, hidden)).encode())
    digest.update(Path(__file__).read_bytes())  # how the root is built
    return digest.hexdigest()[:16]


def ensure_root(cache_dir: Path, python_dirs: list[Path], hidden: list[Path], extra: tuple[str, ...] = ()) -> Path:
    """The folder of the minimal root for these Python folders (host paths under it at their own paths), built on
    first use (seconds) under `cache_dir`. The folders in `hidden` (the trainer's own packages) are left empty, so
    that the sandbox can still cover them. Concurrent callers wait on a lock; a finished build is renamed into place,
    so an interrupted one is never used."""
    files = root_files(tuple(python_dirs), tuple(extra))
    dest = Path(cache_dir) / f"root-{_key(files, tuple(hidden))}"
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f"{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.is_dir():
            return dest
        build = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        try:
            _copy_paths(files, build)
            for folder in hidden:  # empty, where the sandbox sees them (bubblewrap covers them)
                copy = build / folder.relative_to("/")
                if copy.is_dir() and not copy.is_symlink():
                    shutil.rmtree(copy)
                if folder.is_dir() and any(folder.is_relative_to(p) for p in python_dirs):
                    copy.mkdir(parents=True, exist_ok=True)
            for folder in python_dirs:  # reachable by the sandbox uid, which binds them from here
                for parent in [folder, *folder.parents][:-1]:
                    copy = build / parent.relative_to("/")
                    copy.chmod(copy.stat().st_mode | 0o555)
            for top in ("usr", "etc", *(name for name in ROOT_LINKS if Path("/", name).is_dir()
                                            and not Path("/", name).is_symlink())):
                (build / top).mkdir(exist_ok=True)
            _strip_debug(build)
            build.chmod(0o755)
            build.rename(dest)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    return dest


def _copy_paths(files: tuple[Path, ...], dest: Path) -> None:
    """Copy the host paths `files` (folders whole, but `SKIP`) to the same paths under `dest`: one tar for all,
    which keeps the hard links among them and makes the folders above them as the umask says (cp --parents -a
    fails on them in coreutils 9.1)."""
    folders = [p for p in files if p.is_dir() and not p.is_symlink()]
    names = [str(p.relative_to("/")) for p in files if not any(f in p.parents for f in folders)]
    skip = [f"--exclude={pattern}" for pattern in SKIP]
    pack = subprocess.Popen(["tar", "-C", "/", "-cf", "-", *skip, "--", *names], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    unpack = subprocess.run(["tar", "-C", str(dest), "-xpf", "-"], stdin=pack.stdout, capture_output=True)
    pack.stdout.close()
    errors = pack.stderr.read().decode(errors="replace")
    if pack.wait() != 0 or unpack.returncode != 0:
        raise SandboxError(f"building the sandbox root at {dest} failed: {errors[-1500:]}"
                           f"{unpack.stderr.decode(errors='replace')[-1500:]}")


def _strip_debug(folder: Path) -> None:
    """Drop the debugging sections of the ELF files under `folder` (a Python built from source keeps them: three
    quarters of its shared library), which every sandbox would otherwise copy; where binutils' `strip` is missing,
    nothing. Files with other names (hard links) are left whole: strip writes a new file."""
    strip = shutil.which("strip")
    files = [Path(d, n) for d, _, names in os.walk(folder) for n in names]
    elves = [str(p) for p in files if not p.is_symlink() and p.lstat().st_nlink == 1 and _is_elf(p)]
    if strip and elves:
        subprocess.run([strip, "--strip-debug", *elves], capture_output=True)


def copy_root(source: Path, dest: Path) -> None:
    """A private copy of the root `source` at `dest` (made), as `cp -a` makes it."""
    done = subprocess.run(["cp", "-a", f"{source}/.", str(dest)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SandboxError(f"copying the sandbox root {source} to {dest} failed: {done.stderr[-1500:]}")
