"""The run's lifetime: how a training run ends when it is told to stop, so that what it started is released.

`MultiTurnTrainer.train()` runs inside `sigterm_stops_the_run()`: a SIGTERM (a scheduler's preemption, `kill`) unwinds
the run like a Ctrl-C, through the `finally` blocks that close the environments and stop their workers.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


@contextmanager
def sigterm_stops_the_run():
    """Within the block (in the main thread, where SIGTERM has its default action): the first SIGTERM raises
    SystemExit(143) instead of ending the process at once, so that `finally` blocks close the environments, stop the
    workers and kill their process groups; a SIGTERM during that shutdown is ignored. SIGINT needs nothing: its
    KeyboardInterrupt unwinds the same way (the workers ignore it, and run in process groups of their own)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    stopping = []

    def stop(signum, frame):
        if not stopping:
            stopping.append(signum)
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
