"""Rollout throughput: environment steps per second in this process and in worker processes, and whole-episode
throughput of the collator with a tiny model. Prints tables; not a test.

    python benchmarks/rollout_throughput.py                  # TextWorld w2-o3-q4, 16 episodes, workers 0/2/4
    python benchmarks/rollout_throughput.py --episodes 32 --workers 0 4 8 --turns 10

Environment stepping is the part `env_num_workers` parallelises; generation is the trainer's backend's business.
On a machine with C cores, expect the worker speedup to flatten near C.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def env_steps_per_second(tasks, episodes: int, turns: int, workers: int, games_dir: str) -> float:
    """Reset `episodes` TextWorld games and play each game's walkthrough (padded with 'look') for `turns` steps."""
    import functools

    from trl_multiturn.envs import TextWorldEnv
    from trl_multiturn.rollout import EnvFailure, EnvPool

    factory = functools.partial(TextWorldEnv, games_dir=games_dir)
    pool = EnvPool(factory, num_workers=workers)
    rows = [tasks[i % len(tasks)] for i in range(episodes)]
    plans = [factory().expert_actions(row) for row in rows]
    pool.reset(rows)  # warm-up: workers start and load their games
    start = time.perf_counter()
    pool.reset(rows)
    steps = 0
    live = list(range(episodes))
    for turn in range(turns):
        actions = [plans[i][turn] if turn < len(plans[i]) else "look" for i in live]
        results = pool.step(live, actions)
        steps += len(live)
        live = [i for i, r in zip(live, results) if not isinstance(r, EnvFailure) and not r.done]
        if not live:
            pool.reset([rows[i] for i in range(episodes)])
            live = list(range(episodes))
    elapsed = time.perf_counter() - start
    pool.close()
    return steps / elapsed


def collator_throughput(tasks, episodes: int, turns: int, workers: int, games_dir: str, model_dir: str):
    import functools

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiturn.envs import TextWorldEnv
    from trl_multiturn.rollout import MultiTurnRolloutCollator
    from trl_multiturn.rollout.generation import hf_generate_fn

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    collator = MultiTurnRolloutCollator(
        functools.partial(TextWorldEnv, games_dir=games_dir), tokenizer,
        hf_generate_fn(model, tokenizer, temperature=1.0), max_turns=turns, max_reply_tokens=8,
        env_num_workers=workers,
    )
    rows = [tasks[i % len(tasks)] for i in range(episodes)]
    collator(rows[:2])  # warm-up
    start = time.perf_counter()
    played = collator(rows)
    elapsed = time.perf_counter() - start
    collator.close()
    n_turns = sum(ep.num_turns for ep in played)
    sampled = sum(sum(ep.env_mask) for ep in played)
    return episodes / elapsed, n_turns / elapsed, sampled / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    parser.add_argument("--games", type=int, default=4, help="distinct w2-o3-q4 training games")
    args = parser.parse_args()

    from trl_multiturn.data import textworld_tasks
    from trl_multiturn.testing import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        games_dir = os.path.join(tmp, "games")
        tasks = list(textworld_tasks(2, 3, 4, split="train", num_games=args.games, games_dir=games_dir))
        model_dir = build_tiny_model(os.path.join(tmp, "tiny"))
        print(f"TextWorld w2-o3-q4, {args.episodes} episodes x {args.turns} turns, {os.cpu_count()} CPU cores\n")
        print("| env workers | env steps/s | collator episodes/s | turns/s | sampled tokens/s |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for workers in args.workers:
            steps = env_steps_per_second(tasks, args.episodes, args.turns, workers, games_dir)
            eps, turns, tokens = collator_throughput(tasks, args.episodes, args.turns, workers, games_dir, model_dir)
            print(f"| {workers} | {steps:.0f} | {eps:.2f} | {turns:.1f} | {tokens:.0f} |", flush=True)


if __name__ == "__main__":
    main()
