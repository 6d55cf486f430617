"""How many of 16 bits the machine's CPU and disk activity counters carry between two concurrent SWE-Gym sandboxes.

    python benchmarks/swegym_activity_channel.py [--sandbox local|docker] [--trials 3] [--slot 0.5] [--kinds ...]
        [--sandbox-cpus N]

`--kinds` picks among cpu, disk and fork (all by default). Each trial: two sandboxes of `roman` run at once the
attacker's probe of `tests/envs/swegym/kernel_probe.py`; by the clock they share, the first is busy (two spinning
processes, 1 MiB writes with fsync, or forks) in the slots of its 1 bits and idle in the others, while the second reads
every activity counter it can (/proc/stat, /proc/loadavg, /proc/uptime, /proc/diskstats, /sys/block/*/stat,
/proc/interrupts, /proc/softirqs, /proc/schedstat, the per-CPU idle times under /sys), and how much fixed work it gets
done itself, and decodes each slot's movement. Prints, per activity and counter, the bits recovered in each trial (8 of
16 is chance; far fewer than 8 carries bits too, the activity moving the counter the other way; '-' where the counter
could not be read or never moved) and the two-sided binomial p-value of the bits of its other trials together against
chance. `--sandbox-cpus` is `SandboxConfig.sandbox_cpus`: the CPUs each sandbox holds for itself (0: both share the
machine's; the sender's two spinners share its one CPU otherwise), printed on each line.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

from scipy.stats import binomtest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "envs" / "swegym"))
from kernel_probe import command, matching, readers  # noqa: E402

from trl_multiturn.envs.swegym import SandboxConfig, make_sandbox, task_rows  # noqa: E402

KINDS = ("cpu", "disk", "fork")


def trial(pair: list, kind: str, slot: float, rng: random.Random) -> dict[str, int]:
    """Bits the second sandbox recovers of 16 the first one sends by its `kind` of activity."""
    bits = "".join(rng.choice("01") for _ in range(16))
    start = time.time() + 10  # both probes started by then, on a busy machine too
    sender = threading.Thread(target=pair[0].run, args=(command("write", "activity", kind, bits, start, slot),),
                              kwargs={"timeout": 300})
    sender.start()
    found = readers(pair[1].run(command("read", "activity", start, slot), timeout=300).output)
    sender.join()
    return {name: None if read == "?" * 16 else matching(bits, read) for name, read in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sandbox", default="local", choices=["local", "docker"])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--slot", type=float, default=0.5)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--sandbox-cpus", type=int, default=SandboxConfig.sandbox_cpus)
    args = parser.parse_args()
    config = SandboxConfig(sandbox=args.sandbox, command_timeout=300, max_processes=64,
                           sandbox_cpus=args.sandbox_cpus)
    row = next(r for r in task_rows() if r["repo"].endswith("/roman"))
    rng = random.Random()
    pair = [make_sandbox(config), make_sandbox(config)]
    try:
        for sandbox in pair:
            sandbox.start(row)
        for kind in args.kinds:
            results = [trial(pair, kind, args.slot, rng) for _ in range(args.trials)]
            for name in results[0]:
                counts = [r[name] for r in results]
                read = [count for count in counts if count is not None]
                p_value = f"{binomtest(sum(read), 16 * len(read), 0.5).pvalue:.3g}" if read else "-"
                shown = ", ".join("-" if count is None else str(count) for count in counts)
                print(f"{args.sandbox} sandbox_cpus={args.sandbox_cpus} {kind} {name}: [{shown}] of 16, "
                      f"{sum(read)} of {16 * len(read)} bits: "
                      f"binomial p = {p_value}", flush=True)
    finally:
        for sandbox in pair:
            sandbox.close()


if __name__ == "__main__":
    main()
