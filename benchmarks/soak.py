"""Soak: episodes of a toy environment with 10% injected faults of every kind, through a real trainer. Prints a
table and writes `benchmarks/soak.json`; not a test.

    nice -n 10 python benchmarks/soak.py                        # 1,008 episodes (63 GRPO steps of 16), ~13 min
    python benchmarks/soak.py --episodes 160                    # a smoke run
    python benchmarks/soak.py --env-mode ray --episodes 160     # through Ray actors (a local cluster it starts)

The environment is `trl_multiturn.testing.FaultyEnv` (a user-style toy game) run the default way (one worker
process per episode, `env_timeout` 2 s). One dataset row in ten carries a fault, cycling through every kind
(`FAULTS`: an exception, a hang, a worker that exits, a NaN or None reward, an observation that is not a string, a
first observation larger than `max_episode_tokens`) at a random turn of the episode. `MultiTurnGRPOTrainer` trains
the tiny offline model on them (16 episodes per step: 4 rows x 4 generations). Checked after every step: the failed
episodes are exactly the faulty ones, every parameter is finite; measured: the trainer's RSS, its live child
processes and threads; after `close()`: the processes left. With `--env-mode ray` each episode slot's environment is
a Ray actor of a local cluster the trainer starts (its GCS, raylet and workers are the trainer's child processes, so
they are counted among the "workers", and must be gone after `train()`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import psutil
import torch
from measures import descendants, uss_mb

from trl_multiturn.testing import FAULTS

GENERATIONS = 4
ROWS_PER_STEP = 4


def any_reply(reply: str) -> str:
    """Every reply is an action, so that each fault fires at the turn it was placed on."""
    return reply.strip() or "wait"


def soak_tasks(num_rows: int, fault_every: int, seed: int) -> list[dict]:
    """Rows of 1-4 turns; every `fault_every`-th row breaks, at a random turn, in the next kind of `FAULTS`."""
    rng = random.Random(seed)
    rows = []
    for i in range(num_rows):
        target = rng.randint(1, 4)
        row = {"target": target, "fault": None, "fault_turn": 0}
        if i % fault_every == fault_every - 1:
            row["fault"] = FAULTS[(i // fault_every) % len(FAULTS)]
            row["fault_turn"] = rng.randint(1, target)
        rows.append(row)
    rng.shuffle(rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--fault-every", type=int, default=10, help="one row in N carries a fault")
    parser.add_argument("--env-timeout", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-mode", choices=("process", "ray"), default="process")
    parser.add_argument("--out", default=None, help="default: benchmarks/soak.json (soak_ray.json for ray)")
    args = parser.parse_args()
    name = "soak.json" if args.env_mode == "process" else "soak_ray.json"
    args.out = args.out or str(Path(__file__).with_name(name))
    ray_fields = dict(env_ray_address="local", env_ray_num_cpus=0.01) if args.env_mode == "ray" else {}

    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
    from trl_multiturn.testing import FaultyEnv, build_tiny_model

    per_step = GENERATIONS * ROWS_PER_STEP
    steps = math.ceil(args.episodes / per_step)
    rows = soak_tasks(steps * ROWS_PER_STEP, args.fault_every, args.seed)
    samples: list[dict] = []

    class Check(TrainerCallback):
        """After every step: the failed episodes are exactly the faulty ones; parameters are finite; resources."""

        def on_step_end(self, _args, state, control, **kwargs):
            episodes = trainer.last_rollout.episodes
            injected = [ep.task["fault"] is not None for ep in episodes]
            failed = [ep.failed for ep in episodes]
            kinds = [ep.task["fault"] for ep in episodes if ep.task["fault"]]
            children = descendants()
            samples.append({
                "step": state.global_step,
                "episodes": len(episodes),
                "injected": sum(injected),
                "failed": sum(failed),
                "mismatched": sum(i != f for i, f in zip(injected, failed)),
                "kinds": kinds,
                "nonfinite_parameters": sum(int((~torch.isfinite(p)).sum()) for p in trainer.model.parameters()),
                "rss_mb": psutil.Process().memory_info().rss / 2**20,
                "children": len(children),
                "children_uss_mb": uss_mb(children),
                "threads": threading.active_count(),
            })

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(os.path.join(tmp, "tiny"))
        config = MultiTurnGRPOConfig(
            output_dir=os.path.join(tmp, "out"), max_steps=steps, per_device_train_batch_size=per_step,
            num_generations=GENERATIONS, max_turns=5, max_completion_length=8, max_episode_tokens=512,
            reward_mode="dense", action_parser="__main__:any_reply", env_timeout=args.env_timeout,
            env_mode=args.env_mode, **ray_fields,
            learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
            seed=args.seed, disable_tqdm=True,
        )
        trainer = MultiTurnGRPOTrainer(model=model_dir, args=config, environment_factory=FaultyEnv,
                                       train_dataset=Dataset.from_list(rows), callbacks=[Check()])
        trainer.remove_callback(PrinterCallback)  # one log line per step is noise here
        # TRL warns, with the whole row, for every episode no reward function scored (each failed one).
        logging.getLogger("trl.trainer.grpo_trainer").setLevel(logging.ERROR)
        start = time.perf_counter()
        trainer.train()  # releases the environment workers when it ends
        wall = time.perf_counter() - start
        left_after_close = len(descendants())

    quarter = max(1, len(samples) // 4)
    first, last = samples[1: 1 + quarter], samples[-quarter:]  # step 1 warms up (workers start)

    def median(key, part):
        return statistics.median(s[key] for s in part)

    kinds = {kind: sum(s["kinds"].count(kind) for s in samples) for kind in FAULTS}
    summary = {
        "episodes": sum(s["episodes"] for s in samples),
        "steps": len(samples),
        "injected": sum(s["injected"] for s in samples),
        "injected_by_kind": kinds,
        "failed": sum(s["failed"] for s in samples),
        "mismatched": sum(s["mismatched"] for s in samples),
        "nonfinite_parameters": max(s["nonfinite_parameters"] for s in samples),
        "rss_mb_first_quarter": median("rss_mb", first),
        "rss_mb_last_quarter": median("rss_mb", last),
        "children_min": min(s["children"] for s in samples),
        "children_max": max(s["children"] for s in samples),
        "children_uss_mb_first_quarter": median("children_uss_mb", first),
        "children_uss_mb_last_quarter": median("children_uss_mb", last),
        "threads_min": min(s["threads"] for s in samples),
        "threads_max": max(s["threads"] for s in samples),
        "processes_left_after_close": left_after_close,
        "wall_s": wall,
        "cpu_cores": os.cpu_count(),
    }
    Path(args.out).write_text(json.dumps({"summary": summary, "steps": samples}, indent=1) + "\n")

    s = summary
    where = "worker processes" if args.env_mode == "process" else "Ray actors (a local cluster)"
    print(f"\nSoak: {s['episodes']} episodes in {s['steps']} GRPO steps, FaultyEnv in {where}, "
          f"env_timeout {args.env_timeout:g} s, {s['cpu_cores']} CPU cores, {s['wall_s'] / 60:.1f} min\n")
    print("| check | measured | target |")
    print("| --- | ---: | ---: |")
    print(f"| faults injected | {s['injected']} ({', '.join(f'{k} {v}' for k, v in kinds.items())}) | 10% |")
    print(f"| episodes failed | {s['failed']} | = injected |")
    print(f"| episodes whose failure and fault disagree | {s['mismatched']} | 0 |")
    print(f"| non-finite parameters after any step | {s['nonfinite_parameters']} | 0 |")
    print(f"| trainer RSS, median of first / last quarter of steps | {s['rss_mb_first_quarter']:.0f} / "
          f"{s['rss_mb_last_quarter']:.0f} MiB | flat |")
    print(f"| environment workers alive after each step, min / max | {s['children_min']} / {s['children_max']} | "
          f"<= {per_step} (one per episode slot; a killed one restarts at the slot's next reset)"
          f"{'' if args.env_mode == 'process' else ' + the local Ray cluster: GCS, raylet, agents'} |")
    print(f"| workers' private memory (USS, all workers), median of first / last quarter | "
          f"{s['children_uss_mb_first_quarter']:.0f} / {s['children_uss_mb_last_quarter']:.0f} MiB | flat |")
    print(f"| trainer threads, min / max | {s['threads_min']} / {s['threads_max']} | flat |")
    print(f"| processes left after `train()` returned | {s['processes_left_after_close']} | 0 |")


if __name__ == "__main__":
    main()
