"""The measures of the environment-transport benchmarks (benchmarks/measures.py) and their tables."""

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def benchmark_module(monkeypatch):
    """Import a benchmark script the way `python benchmarks/<script>.py` finds its neighbours."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module


def test_percentile_is_the_nearest_rank(benchmark_module):
    percentile = benchmark_module("measures").percentile
    hundred = [float(v) for v in range(100, 0, -1)]  # unsorted on purpose
    assert percentile(hundred, 0.99) == 99.0  # rank ceil(99.0) = 99
    assert percentile(hundred, 0.5) == 50.0
    assert percentile([float(v) for v in range(1, 21)], 0.99) == 20.0  # n < 100: the largest
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([7.0], 0.99) == 7.0


def test_peak_rss_counts_from_its_reset(benchmark_module):
    measures = benchmark_module("measures")
    assert measures.reset_peak_rss(), "Linux >= 4.0 resets the peak through /proc/self/clear_refs"
    before = measures.peak_rss_mb()
    block = b"x" * (128 * 2**20)  # written, so resident
    assert measures.peak_rss_mb() >= before + 120
    del block
    assert measures.reset_peak_rss()
    assert measures.peak_rss_mb() < before + 64  # the 128 MiB block is gone and no longer the peak


def test_uss_sums_live_descendants_and_counts_gone_ones_as_zero(benchmark_module):
    measures = benchmark_module("measures")
    child = subprocess.Popen([sys.executable, "-c", "import time; b = b'x' * (48 * 2**20); time.sleep(60)"])
    try:
        assert child.pid in [p.pid for p in measures.descendants()]
        for _ in range(200):  # until the child has written its block
            if measures.uss_mb([child.pid]) >= 48:
                break
            time.sleep(0.05)
        one = measures.uss_mb([child.pid])
        assert one >= 48
        assert measures.uss_mb([child.pid, psutil.Process(child.pid)]) == pytest.approx(2 * one, rel=0.05)
    finally:
        child.kill()
        child.wait()
    assert measures.uss_mb([child.pid]) == 0
    assert child.pid not in [p.pid for p in measures.descendants()]


class _Titled:
    def __init__(self, title):
        self.title = title

    def cmdline(self):
        return self.title


@pytest.mark.parametrize(("title", "actor"), [
    (["ray::_EnvActor", "", ""], True),  # as Ray titles an idle actor
    (["ray::_EnvActor.call", "", ""], True),  # while it runs a call
    (["ray::_EnvActorX"], False),
    (["ray::IDLE"], False),
    (["ray::DashboardAgent", "", ""], False),
    ([os.path.join("ray", "raylet", "raylet"), "--raylet_socket_name=x"], False),
    ([], False),
])
def test_ray_actor_processes_are_told_by_their_title(benchmark_module, title, actor):
    assert benchmark_module("measures").is_ray_actor(_Titled(title), "_EnvActor") is actor


def test_markdown_table_aligns_numbers_right_and_fills_short_rows(benchmark_module):
    table = benchmark_module("measures").markdown_table(["name", "mode", "a", "b"], [["x", "p", "1", "2"],
                                                                                  ["y", "failed: why"]], 2)
    assert table.splitlines() == ["| name | mode | a | b |", "| --- | --- | ---: | ---: |", "| x | p | 1 | 2 |",
                                  "| y | failed: why | | |"]


def _cells(line: str) -> int:
    return line.count("|") - 1


def test_transport_tables_keep_their_columns_on_failed_rows(benchmark_module):
    done = {"episodes_per_s": 12.0, "median_ms": 50.0, "p99_ms": 60.0, "failed": 0, "startup_s": 3.0,
            "driver_peak_mb": 300.0, "envs_mb": 900.0, "env_processes": 16}
    rows = [{"env": "ALFWorld", "transport": "process", "episodes": 16, **done, "ray_mb": None},
            {"env": "ALFWorld", "transport": "Ray, 1 node", "episodes": 16, **done, "ray_mb": 470.0},
            {"env": "ALFWorld", "transport": "Ray, 1 node", "episodes": 64, "failure": "MemoryError: x"}]
    lines = benchmark_module("env_transport").markdown_table(rows).splitlines()
    assert len(lines) == 2 + len(rows) and len({_cells(line) for line in lines}) == 1
    assert "| 300 MiB | 900 MiB (16) | - |" in lines[2] and lines[3].endswith("| 470 MiB |")
    assert "failed: MemoryError: x" in lines[4]

    timed = {"median_ms": 4.0, "p99_ms": 7.0, "episodes_per_s": 36.0, "driver_peak_mb": 310.0, "envs_mb": 190.0,
             "env_processes": 1}
    openenv_rows = [{"transport": "OpenEnv", "concurrency": 1, "episodes": 2, **timed, "server_rss_mb": 560.0},
                    {"transport": "process pool", "concurrency": 16, "episodes": 32, **timed, "server_rss_mb": None},
                    {"transport": "OpenEnv", "concurrency": 256, "failure": "256 resets failed: x"}]
    lines = benchmark_module("env_transport_openenv").markdown_table(openenv_rows, "# title").splitlines()
    table = lines[2:]
    assert lines[0] == "# title" and len(table) == 2 + len(openenv_rows) and len({_cells(x) for x in table}) == 1
    assert "| 1 (single call) |" in table[2] and table[2].endswith("| 310 | 190 (1) | 560 |")
    assert table[3].endswith("| 310 | 190 (1) | - |") and "failed: 256 resets failed" in table[4]
