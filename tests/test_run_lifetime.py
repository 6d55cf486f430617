"""`sigterm_stops_the_run`: the first SIGTERM unwinds the run through its `finally` blocks, a second one during that
shutdown is ignored, and the default action comes back after the block. (The whole path, a trainer told to stop
leaving no process and no folder behind, is `test_shutdown.py`'s.)"""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_RUN = """
import os, signal
from trl_multiturn.run_lifetime import sigterm_stops_the_run
try:
    with sigterm_stops_the_run():
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the run is told to stop
            print("not stopped", flush=True)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # again, while it shuts down: ignored
            print("closed", flush=True)
except SystemExit as stop:
    print("exit", stop.code, flush=True)
print("default again", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
"""


def test_sigterm_unwinds_the_run_once_and_restores_the_default():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_RUN)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["closed", "exit 143", "default again True"]


def test_a_sigterm_handler_of_the_caller_is_left_alone():
    """A program that handles SIGTERM itself keeps its handler inside the block."""
    from trl_multiturn.run_lifetime import sigterm_stops_the_run

    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with sigterm_stops_the_run():
            assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)
