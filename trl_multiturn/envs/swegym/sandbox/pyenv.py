"""The Python that sandboxed commands run: a virtual environment of its own, never the trainer's.

The trainer's environment holds trl_multiturn, and with it every shipped task's gold patch and hidden tests; a
command that could import it would read the answer key. So commands get a separate virtual environment, made
once per machine from the trainer's *base* interpreter with only the tasks' test requirements installed from
the package index, and cached under a name that hashes what went into it.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

from .base import SandboxError

# What the shipped tasks' tests need; the Docker images install the same pins, so both backends grade alike.
TEST_REQUIREMENTS = ("pytest==8.3.5", "pluggy==1.5.0", "iniconfig==2.0.0", "packaging==24.2")


def base_interpreter() -> Path:
    """The interpreter this process's virtual environment (if any) was made from."""
    return Path(getattr(sys, "_base_executable", None) or sys.executable).resolve()


def _key(interpreter: Path, requirements: tuple[str, ...]) -> str:
    recipe = "\n".join([str(interpreter), sys.version, *requirements])
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def ensure_task_python(cache_dir: Path, requirements: tuple[str, ...] = TEST_REQUIREMENTS) -> Path:
    """The folder of the task virtual environment, built on first use (seconds; needs the package index once).

    Concurrent callers wait on a lock file; a finished build is marked by `.complete`, so an interrupted one is
    redone rather than used.
    """
    interpreter = base_interpreter()
    dest = Path(cache_dir) / f"python-{_key(interpreter, requirements)}"
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f"{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").exists():
            return dest
        steps = [
            [str(interpreter), "-m", "venv", "--clear", "--without-pip", str(dest)],
            [sys.executable, "-m", "pip", "--python", str(dest / "bin" / "python"), "install", "--quiet",
             "--disable-pip-version-check", "--no-cache-dir", *requirements],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                raise SandboxError(
                    f"building the task Python at {dest} failed ({' '.join(step[:4])} ...): {done.stderr[-1500:]}\n"
                    "It needs pip and the package index once; or point task_python at a virtual environment "
                    f"with {' '.join(requirements)}"
                )
        (dest / ".complete").write_text("\n".join(requirements) + "\n")
    return dest
