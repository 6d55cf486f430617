"""Trajectory vs step-wise `window:K` training at equal episodes: peak memory and time per step; not a test.

    nice -n 15 python benchmarks/stepwise_memory.py                      # a few minutes on 2 shared cores
    python benchmarks/stepwise_memory.py --turns 40 --histories window:2 window:4 --steps 3

Each configuration trains `MultiTurnGRPOTrainer` in its own process (so that the peak resident memory, `ru_maxrss`,
is its own) on the same long episodes: a toy environment that answers every turn with a fixed-size observation and
ends after `--turns` turns, a tiny random model, the same episodes per step. Columns: the longest training sample
(tokens), the tokens the trainer's forward passes read per step (every sample's context and reply), the median
wall time of a training step after the first, and the process's peak resident memory. With a tiny model the memory
column is dominated by the Python process itself; the token columns are what scales with a real model (attention
cost grows with the square of a sample's length).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from transformers import TrainerCallback

from trl_multiturn.envs.base import Environment, StepResult

OBSERVATION = "You are in a long corridor. Doors lead north, south, east and west. A lamp flickers above you. "


class CorridorEnv(Environment):
    """Every turn returns the same long observation; the episode is won after task["turns"] turns."""

    def reset(self, task):
        self.turn, self.turns = 0, task["turns"]
        return f"Walk {self.turns} rooms. " + OBSERVATION

    def step(self, action):
        self.turn += 1
        done = self.turn >= self.turns
        return StepResult(f"Room {self.turn}. " + OBSERVATION, reward=1.0, done=done, won=done)


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times, self.start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)


def run_one(history: str, turns: int, episodes: int, steps: int) -> dict:
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
    from trl_multiturn.testing import build_tiny_model

    stepwise = history != "trajectory"
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(f"{tmp}/model", hidden_size=64, num_layers=2)
        args = MultiTurnGRPOConfig(
            output_dir=f"{tmp}/out", max_turns=turns, num_generations=2, per_device_train_batch_size=episodes,
            max_completion_length=8, max_steps=steps, learning_rate=1e-4, use_cpu=True, bf16=False,
            report_to="none", save_strategy="no", seed=0, reward_mode="dense", max_observation_tokens=None,
            action_parser="trl_multiturn.rollout.parsing:whole_reply", advantage_estimator="turn_grpo",
            **({"episode_format": "stepwise", "history": history} if stepwise else {}))
        timer = StepTimes()
        trainer = MultiTurnGRPOTrainer(model=model, args=args, environment_factory=CorridorEnv,
                                       train_dataset=Dataset.from_list([{"turns": turns}] * episodes),
                                       callbacks=[timer])
        trainer.train()
        batch = trainer.last_rollout
        rows = batch.token_lists(0, 0)
        lengths = [len(p) + len(c) for p, c, _, _ in rows]
    return {"history": history, "samples": len(rows), "longest": max(lengths), "tokens_read": sum(lengths),
            "step_s": statistics.median(timer.times[1:] or timer.times),
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--histories", nargs="+", default=["trajectory", "window:2", "window:4"])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.turns, args.episodes, args.steps)))
        return
    print(f"{args.episodes} episodes of {args.turns} turns per step, {args.steps} steps, tiny random model (CPU)")
    print(f"{'format':<12} {'samples':>8} {'longest':>8} {'tokens read':>12} {'s/step':>8} {'peak MiB':>9}")
    for history in args.histories:
        out = subprocess.run([sys.executable, __file__, "--one", history, "--turns", str(args.turns), "--episodes",
                              str(args.episodes), "--steps", str(args.steps)], capture_output=True, text=True,
                             check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['history']:<12} {r['samples']:>8} {r['longest']:>8} {r['tokens_read']:>12} {r['step_s']:>8.2f} "
              f"{r['peak_mib']:>9.0f}")


if __name__ == "__main__":
    main()
