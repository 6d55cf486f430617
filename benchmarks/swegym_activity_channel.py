"""How many of 16 bits the machine's CPU and disk activity counters carry between two concurrent SWE-Gym sandboxes.

    python benchmarks/swegym_activity_channel.py [--sandbox local|docker] [--trials 3] [--slot 0.5] [--kinds ...]
        [--sandbox-cpus N]
    python benchmarks/swegym_activity_channel.py --sandbox docker --consecutive 8 [--megabytes 256]

`--kinds` picks among cpu, disk, space and fork (all by default). Each trial: two sandboxes of `roman` run at once the
attacker's probe of `tests/envs/swegym/kernel_probe.py`; by the clock they share, the first is busy (two spinning
processes, 1 MiB writes with fsync, 64 MiB of files kept, or forks) in the slots of its 1 bits and idle in the others,
while the second reads every activity counter it can (/proc/stat, /proc/loadavg, /proc/uptime, /proc/diskstats,
/sys/block/*/stat, /proc/interrupts, /proc/softirqs, /proc/schedstat, the per-CPU idle times under /sys, the free
space of every file system it sees), and how much fixed work it gets done itself, and decodes each slot's movement.
`--consecutive N` sends N bits through the free space from each sandbox to the next instead: sandboxes of `roman` one
after the other, each reading the free space of every file system it sees (`read space`) and then, for a 1 bit,
writing `--megabytes` MiB into every place it may write (`write space`) before it is closed; the next one's reading
decodes the bit (a file system whose free space fell by half of that or more since the last reading: 1).
Prints, per activity and counter, the bits recovered in each trial (8 of
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

KINDS = ("cpu", "disk", "space", "fork")


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


def free_space(sandbox) -> dict[str, int]:
    """{mount point: free bytes} of every file system `sandbox` sees."""
    output = sandbox.run(command("read", "space"), timeout=300).output
    return {line.split()[1]: int(line.split()[2]) for line in output.splitlines()
            if line.startswith("space ") and line.split()[2].isdigit()}


def consecutive(config, row: dict, count: int, megabytes: int, rng: random.Random) -> None:
    """Send `count` random bits through the free space from each sandbox to the next; print what the readers got."""
    bits = "".join(rng.choice("01") for _ in range(count))
    readings = []
    for bit in bits + "0":  # the last sandbox only reads
        with make_sandbox(config) as sandbox:
            sandbox.start(row)
            readings.append(free_space(sandbox))
            if bit == "1":
                print(sandbox.run(command("write", "space", megabytes), timeout=600).output.strip(), flush=True)
    read = ""
    for before, after in zip(readings, readings[1:]):
        fell = [p for p in before if p in after and before[p] - after[p] >= megabytes << 19]
        read += "1" if fell else "0"
    recovered = sum(a == b for a, b in zip(bits, read))
    print(f"{config.sandbox} consecutive free space: sent {bits}, read {read}: {recovered} of {count} bits "
          f"(binomial p = {binomtest(recovered, count, 0.5).pvalue:.3g})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sandbox", default="local", choices=["local", "docker"])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--slot", type=float, default=0.5)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--sandbox-cpus", type=int, default=SandboxConfig.sandbox_cpus)
    parser.add_argument("--consecutive", type=int, default=0, help="bits sent between consecutive sandboxes")
    parser.add_argument("--megabytes", type=int, default=256, help="MiB a --consecutive 1 bit writes per place")
    args = parser.parse_args()
    config = SandboxConfig(sandbox=args.sandbox, command_timeout=300, max_processes=64,
                           sandbox_cpus=args.sandbox_cpus)
    row = next(r for r in task_rows() if r["repo"].endswith("/roman"))
    rng = random.Random()
    if args.consecutive:
        consecutive(config, row, args.consecutive, args.megabytes, rng)
        return
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
