"""How many of 16 bits the page cache of files every sandbox reads carries from one SWE-Gym sandbox to the next.

    python benchmarks/swegym_page_cache_channel.py [--sandbox local|docker] [--trials 5]

Each trial: a first sandbox of `roman` runs the attacker's probe of `tests/envs/swegym/kernel_probe.py`, reading
the first pages of the shared read-only files of its 1 bits (picked at random among /usr's, so cold); it closes,
and a second sandbox recovers the bits with every reader the probe has (timing a read, preadv's RWF_NOWAIT, counting
major faults on an mmap). Prints, per reader, the bits recovered in each trial (8 of 16 is chance; '?' answers
recover none), the mean, and the one-sided binomial test of all its trials' bits together against chance (p = 1/2
per bit): its p-value is how often chance alone recovers that many or more.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from scipy.stats import binomtest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "envs" / "swegym"))
from kernel_probe import command, matching, readers  # noqa: E402

from trl_multiturn.envs.swegym import SandboxConfig, make_sandbox, task_rows  # noqa: E402


def trial(config: SandboxConfig, row: dict, rng: random.Random) -> dict[str, int]:
    """Bits recovered by each reader of a second sandbox, from 16 a first one set by reading."""
    salt, bits = rng.randrange(1 << 30), "".join(rng.choice("01") for _ in range(16))
    with make_sandbox(config) as first:
        first.start(row)
        first.run(command("write", "pagecache", salt, bits), timeout=300)
    with make_sandbox(config) as second:
        second.start(row)
        found = readers(second.run(command("read", "pagecache", salt), timeout=300).output)
    return {name: matching(bits, read) for name, read in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sandbox", default="local", choices=["local", "docker"])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    config = SandboxConfig(sandbox=args.sandbox, command_timeout=300, max_processes=64)
    row = next(r for r in task_rows() if r["repo"].endswith("/roman"))
    rng = random.Random()
    results = [trial(config, row, rng) for _ in range(args.trials)]
    for name in results[0]:
        counts = [r[name] for r in results]
        p_value = binomtest(sum(counts), 16 * len(counts), 0.5, alternative="greater").pvalue
        print(f"{args.sandbox} {name}: {counts} of 16, mean {sum(counts) / len(counts):.1f}, "
              f"{sum(counts)} of {16 * len(counts)} bits: binomial p = {p_value:.3g}")


if __name__ == "__main__":
    main()
