"""What the benchmarks measure besides time (env_transport.py, env_transport_openenv.py, soak.py): the nearest-rank
percentile of turn times, the driving process's peak RSS per row, the private memory (USS) of the processes the
environments live in, and the heading of a result table. Not a benchmark itself.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Iterable

import psutil


def percentile(values: list[float], q: float) -> float:
    """The `q`-quantile of `values` by the nearest rank: the value at rank ceil(q * n) of the sorted values (p99 of
    fewer than 100 values is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def reset_peak_rss() -> bool:
    """Set this process's peak RSS (what `ru_maxrss` reports) back to its current RSS, so that the next
    `peak_rss_mb()` is the peak since now (Linux >= 4.0: "5" written to /proc/self/clear_refs). False where that is
    not possible: the peak then counts from the start of the process."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (`getrusage(RUSAGE_SELF).ru_maxrss`, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """The live (not zombie) processes below `pid` (default: this process), children's children included."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def is_ray_actor(process: psutil.Process, class_name: str) -> bool:
    """Whether `process` is a Ray worker running an actor of `class_name` (Ray titles it "ray::<class>" and
    "ray::<class>.<method>" while it runs a call)."""
    try:
        title = process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return bool(title) and title[0].split(".")[0].split()[0] == f"ray::{class_name}"


def uss_mb(processes: Iterable[psutil.Process | int]) -> float:
    """The private memory (USS: pages no other process maps) of `processes` summed, in MiB; a process that is gone
    counts 0. A forked worker's RSS also counts the pages it still shares with its parent; its USS is what it adds."""
    total = 0
    for process in processes:
        try:
            total += (process if isinstance(process, psutil.Process) else psutil.Process(process)) \
                .memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 2**20


def markdown_table(header: list[str], rows: list[list[str]], text_columns: int = 1) -> str:
    """A Markdown table: the first `text_columns` columns left-aligned, the others (numbers) right-aligned; a row with
    fewer cells than `header` (a failed row: its label, then "failed: why") is filled with empty cells."""
    rule = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)

    def line(cells: list[str]) -> str:
        cells = cells + [""] * (len(header) - len(cells))
        return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"

    return "\n".join(line(cells) for cells in [header, rule, *rows])


def heading(command: str, load_at_start: float) -> str:
    """The first line of a result table: the command, the date, the cores and the 1-minute load average at the
    start and at the end of the run."""
    return (f"# {command}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPU cores, load "
            f"average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
