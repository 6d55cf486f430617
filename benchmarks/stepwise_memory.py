"""Trajectory vs step-wise `window:K` training at equal episodes: peak memory and time per step; not a test.

    nice -n 15 python benchmarks/stepwise_memory.py                      # a few minutes on 2 shared cores
    nice -n 15 python benchmarks/stepwise_memory.py --env alfworld --turns 40
    nice -n 15 python benchmarks/stepwise_memory.py --env swegym --turns 20
    python benchmarks/stepwise_memory.py --turns 40 --histories window:2 window:4 --steps 3

Each configuration trains `MultiTurnGRPOTrainer` in its own process (so that the peak resident memory, `ru_maxrss`,
is its own) on the same long episodes, with a tiny random model and the same episodes per step. Environments
(`--env`):

- `corridor`: a toy environment that answers every turn with a fixed-size observation and ends after `--turns`
  turns.
- `alfworld`: generated ALFWorld games (`--games_dir`, made once) with the admissible commands in every observation;
  the random model's reply picks one of them (`RandomWalkALFWorldEnv`), so the episode walks the room, opening
  and taking things, until it wins or `--turns` run out.
- `swegym`: the shipped SWE-Gym tasks in the local sandbox (no Docker); every reply becomes a `<bash>` command that
  prints a slice of the repository's files (`show_repository_slice`), so each turn brings a long tool output.

Columns: the mean turns per episode, the longest training sample (tokens), the tokens the trainer's forward passes
read per step (every sample's context and reply), the median wall time of a training step after the first and the
part of it outside the rollouts (scoring, loss, backward and optimizer: what the format changes most), the
process's peak resident memory, and its growth during training (the peak minus the resident memory just before
`train()`). With a tiny model the memory columns are dominated by the Python process and the rollout; the token
columns are what scales with a real model (attention cost grows with the square of a sample's length).
tracemalloc is not reported: it sees Python's allocator only, not torch's tensors.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

from transformers import TrainerCallback

from trl_multiturn.envs.alfworld import ALFWorldConfig, ALFWorldEnv
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


def pick(reply: str, choices: list[str]) -> str:
    """One of `choices`, chosen by the reply's bytes: a random model's replies make a random walk."""
    return choices[zlib.crc32(reply.encode()) % len(choices)]


class RandomWalkALFWorldEnv(ALFWorldEnv):
    """ALFWorld with admissible commands listed; every reply is mapped onto one of the commands just listed."""

    def reset(self, task):
        self.observation = super().reset(task)
        return self.observation

    def step(self, action):
        listed = self.observation.rsplit("Admissible actions: ", 1)[1].rstrip(".").split(", ")
        result = super().step(pick(action, listed))
        self.observation = result.observation
        return result


def show_repository_slice(reply: str) -> str:
    """Action parser for the SWE-Gym rows: a `<bash>` command printing 1,500 characters of the repository's tracked
    files, from an offset chosen by the reply. The files are read five times over: the shipped repositories hold
    1,900-3,100 characters, so read once, an offset past their end would print nothing."""
    offset = zlib.crc32(reply.encode()) % 6000
    return f"<bash>for _ in 1 2 3 4 5; do git ls-files | xargs cat; done | tail -c +{offset + 1} | head -c 1500</bash>"


def environment(name: str, turns: int, episodes: int, games_dir: str, tmp: str):
    """`(environment_factory, train_dataset rows, config overrides)` of the benchmark's environment `name`."""
    games = episodes // 2  # num_generations=2 episodes per game
    if name == "corridor":
        return CorridorEnv, [{"turns": turns}] * episodes, {
            "reward_mode": "dense", "action_parser": "trl_multiturn.rollout.parsing:whole_reply"}
    if name == "alfworld":
        from trl_multiturn.envs.alfworld import alfworld_tasks
        from trl_multiturn.envs.alfworld.generator import ALFWorldGenConfig

        # the paper-scale recipe's room size (recipes/alfworld_gigpo_stepwise.yaml)
        rows = alfworld_tasks("train", games, ["pick_clean_then_place_in_recep"], games_dir=games_dir,
                              gen_config=ALFWorldGenConfig(num_receptacles=14, num_distractors=12, num_closed=5),
                              progress=False)
        factory = functools.partial(RandomWalkALFWorldEnv, ALFWorldConfig(admissible_commands=True))
        return factory, [row for row in rows for _ in range(2)], {
            "reward_mode": "sparse", "action_parser": "trl_multiturn.rollout.parsing:whole_reply"}
    if name == "swegym":
        from trl_multiturn.envs.swegym import SWEGymConfig, SWEGymEnv, task_rows

        rows = task_rows(["intervals", "rpn", "lrucache", "semver"][:games])
        factory = functools.partial(SWEGymEnv, SWEGymConfig(repo_cache_dir=f"{tmp}/repos", command_timeout=10))
        return factory, [row for row in rows for _ in range(2)], {
            "reward_mode": "sparse", "action_parser": f"{__name__}:show_repository_slice"}
    raise ValueError(f"--env {name!r}: choose corridor, alfworld or swegym")


def resident_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


class StepTimes(TrainerCallback):
    """Wall time of each training step, and of the rollouts (episodes played) within it (`timed`)."""

    def __init__(self):
        self.times, self.rollout_times, self.start, self.rollout = [], [], None, 0.0

    def timed(self, rollout):
        def timed_rollout(*args, **kwargs):
            start = time.perf_counter()
            try:
                return rollout(*args, **kwargs)
            finally:
                self.rollout += time.perf_counter() - start
        return timed_rollout

    def on_step_begin(self, args, state, control, **kwargs):
        self.start, self.rollout = time.perf_counter(), 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)
        self.rollout_times.append(self.rollout)


def run_one(env: str, history: str, turns: int, episodes: int, steps: int, games_dir: str) -> dict:
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
    from trl_multiturn.testing import build_tiny_model

    stepwise = history != "trajectory"
    with tempfile.TemporaryDirectory() as tmp:
        factory, rows, env_args = environment(env, turns, episodes, games_dir, tmp)
        model = build_tiny_model(f"{tmp}/model", hidden_size=64, num_layers=2)
        args = MultiTurnGRPOConfig(
            output_dir=f"{tmp}/out", max_turns=turns, num_generations=2, per_device_train_batch_size=episodes,
            max_completion_length=8, max_steps=steps, learning_rate=1e-4, use_cpu=True, bf16=False,
            report_to="none", save_strategy="no", seed=0, max_observation_tokens=None,
            advantage_estimator="turn_grpo", **env_args,
            **({"episode_format": "stepwise", "history": history} if stepwise else {}))
        timer = StepTimes()
        trainer = MultiTurnGRPOTrainer(model=model, args=args, environment_factory=factory,
                                       train_dataset=Dataset.from_list(rows), callbacks=[timer])
        trainer.step.episodes.play = timer.timed(trainer.step.episodes.play)  # the episodes played, timed
        before = resident_mib()
        trainer.train()
        batch = trainer.last_rollout
        samples = batch.token_lists(0, 0)
        lengths = [len(p) + len(c) for p, c, _, _ in samples]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    outside_rollouts = [t - r for t, r in zip(timer.times, timer.rollout_times)]
    return {"history": history, "turns": statistics.mean(ep.num_turns for ep in batch.episodes),
            "samples": len(samples), "longest": max(lengths), "tokens_read": sum(lengths),
            "step_s": statistics.median(timer.times[1:] or timer.times),
            "train_s": statistics.median(outside_rollouts[1:] or outside_rollouts),
            "peak_mib": peak,
            "growth_mib": peak - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="corridor", choices=["corridor", "alfworld", "swegym"])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--histories", nargs="+", default=["trajectory", "window:2", "window:4"])
    parser.add_argument("--games_dir", default="outputs/stepwise_memory_games", help="--env alfworld: generated games")
    parser.add_argument("--parallel", action="store_true",
                        help="run the configurations at once (on a loaded machine each gets a share of the cores; "
                        "their times then include each other's load)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.env, args.one, args.turns, args.episodes, args.steps, args.games_dir)))
        return
    if args.env == "alfworld":
        with tempfile.TemporaryDirectory() as tmp:
            environment(args.env, args.turns, args.episodes, args.games_dir, tmp)  # the games, made once
    print(f"{args.env}: {args.episodes} episodes of up to {args.turns} turns per step, {args.steps} steps, tiny "
          f"random model (CPU){', run at once' if args.parallel else ''}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'format':<12} {'turns':>6} {'samples':>8} {'longest':>8} {'tokens read':>12} {'s/step':>8} "
          f"{'of it not rollout':>18} {'peak MiB':>9} {'growth MiB':>11}")
    commands = [[sys.executable, __file__, "--one", history, "--env", args.env, "--turns", str(args.turns),
                 "--episodes", str(args.episodes), "--steps", str(args.steps), "--games_dir", args.games_dir]
                for history in args.histories]
    if args.parallel:
        running = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for c in commands]
        outputs = [p.communicate()[0] for p in running]
        if any(p.returncode for p in running):
            raise SystemExit(f"a configuration failed: exit codes {[p.returncode for p in running]}")
    else:
        outputs = (subprocess.run(c, capture_output=True, text=True, check=True).stdout for c in commands)
    for out in outputs:
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{r['history']:<12} {r['turns']:>6.1f} {r['samples']:>8} {r['longest']:>8} {r['tokens_read']:>12} "
              f"{r['step_s']:>8.2f} {r['train_s']:>18.2f} {r['peak_mib']:>9.0f} {r['growth_mib']:>11.0f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
