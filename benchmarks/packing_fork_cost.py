"""Calibrates `packing="auto"`'s price of forked layer states (trl_multiturn/trainers/packing.py, `fork_cost`)
against padded rows on this machine; not a test.

    nice -n 19 python benchmarks/packing_fork_cost.py --threads 1 --repeats 2 \
        --only "(m)" "(u)" "(d)" "(c) step-wise window:2, 10" "(c) step-wise full, 10" "(b)" \
        "(c) step-wise window:2, 5" "(c) step-wise full, 5" --out benchmarks/results/packing_fork_cost.json
                                                 # the measurements of benchmarks/results/packing_states.md
    python benchmarks/packing_fork_cost.py --table benchmarks/results/packing_fork_cost.json   # the fit and table
                                                 # again from those times, with `fork_cost`'s current prices

Model: benchmarks/packing.py's Qwen3.5-shaped one (three Gated-DeltaNet layers to one attention layer, hidden 256,
SmolLM2's vocabulary), CPU, `--threads` threads (a forward's fixed cost, in tokens, depends on them: see
benchmarks/results/packing_states.md). Rows: benchmarks/packing.py's shapes (a)-(d) (ALFWorld, SWE-Gym-sized,
step-wise `window:2` and `full` at 5, 10 and 20 turns, TextWorld) and the model matrix's small GRPO group
(`model_matrix._group_rows`: four replies of 3-8 tokens to a 24-token prompt) and 16 rows that share nothing. Per
shape, one GRPO step of each path (benchmarks/packing.py's `one_step`: the no-grad old log-probs and the loss's
forward and backward), padded and forked alternated `--repeats` times after a warm-up, the best time of each; and the
forwards each path runs (`packing_states.forked_forwards`; the padded rows: one forward of B x W). Least squares fit
the step's seconds, both paths' together (relative errors, so that the long steps do not outweigh the short), as

    seconds = a forwards + b work

(`packing.fork_work`: per path its forwards and their FLOPs in tokens' worth: tokens with padding, attention pairs
and LM-head logits, each weighted by the model's FLOP ratios), so a / b is a forward's fixed price in tokens
(`packing.FORWARD_TOKENS`); the table prints each shape's times, `packing.fork_cost`'s prices with the library's
FORWARD_TOKENS for the measured threads, which path they choose and whether that was the faster one. The load
average is printed beside each shape (other work shares this machine's cores: the two paths of a shape run in turn
so that its load falls on both alike).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import packing as bench  # noqa: E402  (benchmarks/packing.py)


def main() -> None:
    import torch

    from trl_multiturn.cache import cache_dir
    from trl_multiturn.trainers.model_matrix import _group_rows
    from trl_multiturn.trainers.packing_states import forked_forwards, plan_forks

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="the shapes whose names start so, e.g. '(b)' '(c) step-wise full'")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", help="write the measurements as JSON here")
    parser.add_argument("--table", help="print the fit and the table from this --out file, measuring nothing")
    args = parser.parse_args()
    if args.table:
        return report(json.loads(Path(args.table).read_text()))
    torch.set_num_threads(args.threads)
    model, tokenizer = bench.load_model(None, family_name="Qwen3.5")
    model.train()
    shape_args = argparse.Namespace(alf_turns=4, turns=20, swe_prompt=2100,
                                    games_dir=str(cache_dir("textworld_games")))
    all_rows = bench.shapes(shape_args, tokenizer)
    rng = random.Random(0)
    all_rows["(m) model matrix's group: 4 replies of 3-8 to 24"] = _group_rows(model)
    all_rows["(u) unshared: 16 rows of 100-160, replies 16"] = [
        ([rng.randrange(1000, 40000) for _ in range(100 + 4 * i)], [rng.randrange(1000, 40000) for _ in range(16)])
        for i in range(16)]
    measured = []
    for name, rows in all_rows.items():
        if args.only and not any(name.startswith(start) for start in args.only):
            continue
        times = {"padded": [], "forked": []}
        load = os.getloadavg()[0]
        for repeat in range(args.repeats + 1):
            for path, packing in (("padded", "padded"), ("forked", "prefix")):
                seconds = bench.one_step(model, rows, packing)
                if repeat:
                    times[path].append(seconds)
        ids, mask, keep = bench.padded_batch(rows)
        forked = forked_forwards(plan_forks(ids, mask, keep))
        forwards = {"padded": [(len(rows), ids.shape[1], ids.shape[1])], "forked": forked}
        measured.append({"shape": name, "threads": args.threads, "rows": rows, "load": [load, os.getloadavg()[0]],
                         "forwards": forwards, **{path: min(t) for path, t in times.items()}})
        print(f"measured {name}: padded {min(times['padded']):.2f} s, forked {min(times['forked']):.2f} s "
              f"({len(forwards['forked'])} forked forwards), load {load:.1f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(measured) + "\n")
    report(measured)


def report(measured: list[dict]) -> None:
    """The least-squares fit of both paths' step times on their forwards and work (`packing.fork_work`), and per
    shape the times, the prices `packing.fork_cost` gives (with the library's `FORWARD_TOKENS`) and whether its
    choice was the faster path."""
    import torch

    from trl_multiturn.trainers.packing import FORWARD_TOKENS, fork_cost, fork_work
    from trl_multiturn.trainers.packing_states import plan_forks

    torch.set_num_threads(measured[0]["threads"])  # `fork_cost` prices a forward by the threads
    model, _ = bench.load_model(None, family_name="Qwen3.5")
    batches = [bench.padded_batch([tuple(row) for row in m["rows"]]) for m in measured]
    plans = [(plan_forks(*batch), batch[1]) for batch in batches]  # (the rows' fork plan, their padded mask)
    x = np.array([path for plan in plans for path in fork_work(model, *plan)], dtype=float)
    y = np.array([m[path] for m in measured for path in ("padded", "forked")])
    (a, b), *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)  # relative errors
    error = np.abs(x @ (a, b) / y - 1).max()
    print(f"\nfit ({measured[0]['threads']} threads): seconds = {a:.3g} x forwards + {b:.3g} x work;  per forward "
          f"{a / b:.0f} tokens (FORWARD_TOKENS: {FORWARD_TOKENS}); largest error {error:.0%}\n")
    print("| shape | forked forwards | tokens: padded / forked | padded s | forked s | padded / forked | "
          "price: padded / forked | auto | right | load |\n|---|---:|---:|---:|---:|---:|---:|---|---|---|")
    for m, plan in zip(measured, plans, strict=True):
        padded_price, forked_price = fork_cost(model, *plan)
        choice = "forked" if forked_price < padded_price else "padded"
        faster = "forked" if m["forked"] < m["padded"] else "padded"
        tokens = {path: sum(n * q for n, q, _ in m["forwards"][path]) for path in ("padded", "forked")}
        print(f"| {m['shape']} | {len(m['forwards']['forked'])} | {tokens['padded']:,} / {tokens['forked']:,} | "
              f"{m['padded']:.2f} | {m['forked']:.2f} | {m['padded'] / m['forked']:.2f}x | "
              f"{padded_price:,.0f} / {forked_price:,.0f} | {choice} | {'yes' if choice == faster else 'NO'} | "
              f"{m['load'][0]:.1f}-{m['load'][1]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
