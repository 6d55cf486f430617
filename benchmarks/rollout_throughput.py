"""Rollout throughput per `env_mode`: a delay environment against its lockstep bound, then TextWorld's environment
steps per second and the collator's whole-episode throughput with a tiny model. Prints tables; not a test.

    python benchmarks/rollout_throughput.py                  # 16 episodes x 8 turns; modes inline, auto, thread
    python benchmarks/rollout_throughput.py --episodes 32 --modes inline process --turns 10

The delay environment's steps each sleep `--delay` seconds (no CPU), so the rollout's wall time can reach the
lockstep bound, the generation time plus turns x delay, only if the steps of all episodes overlap; "inline"
(one step after another) shows the serial cost. TextWorld's steps are CPU-bound: worker processes ("auto" picks
them for TextWorld) scale with the machine's cores, threads do not.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_multiturn import Environment, StepResult  # noqa: E402


class DelayEnv(Environment):
    """Every step sleeps `delay` seconds; episodes never end by themselves."""

    def __init__(self, delay: float):
        self.delay = delay

    def reset(self, task):
        self.turn = 0
        return "Wait for it."

    def step(self, action):
        time.sleep(self.delay)
        self.turn += 1
        return StepResult(f"Turn {self.turn}.")


def delay_rollout(episodes: int, turns: int, mode: str, delay: float, model_dir: str):
    """(wall seconds, generation seconds) of one collator call on the delay environment."""
    import functools

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiturn.rollout import MultiTurnRolloutCollator
    from trl_multiturn.rollout.generation import hf_generate_fn

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    generate = hf_generate_fn(model, tokenizer, temperature=1.0)
    generation = [0.0]

    def timed(contexts, max_new_tokens):
        start = time.perf_counter()
        out = generate(contexts, max_new_tokens)
        generation[0] += time.perf_counter() - start
        return out

    collator = MultiTurnRolloutCollator(functools.partial(DelayEnv, delay), tokenizer, timed, max_turns=turns,
                                        max_reply_tokens=8, action_parser=lambda reply: "wait", env_mode=mode)
    collator([{}] * episodes)  # warm-up: workers start
    generation[0] = 0.0
    start = time.perf_counter()
    collator([{}] * episodes)
    wall = time.perf_counter() - start
    collator.close()
    return wall, generation[0]


def env_steps_per_second(tasks, episodes: int, turns: int, mode: str, games_dir: str) -> float:
    """Reset `episodes` TextWorld games and play each game's walkthrough (padded with 'look') for `turns` steps."""
    import functools

    from trl_multiturn.envs import TextWorldEnv
    from trl_multiturn.rollout import EnvFailure, EnvPool

    factory = functools.partial(TextWorldEnv, games_dir=games_dir)
    pool = EnvPool(factory, mode=mode)
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


def collator_throughput(tasks, episodes: int, turns: int, mode: str, games_dir: str, model_dir: str):
    import functools

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiturn.envs import TextWorldEnv
    from trl_multiturn.rollout import MultiTurnRolloutCollator
    from trl_multiturn.rollout.generation import hf_generate_fn

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    collator = MultiTurnRolloutCollator(
        functools.partial(TextWorldEnv, games_dir=games_dir), tokenizer,
        hf_generate_fn(model, tokenizer, temperature=1.0), max_turns=turns, max_reply_tokens=8,
        env_mode=mode,
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
    parser.add_argument("--modes", nargs="+", default=["inline", "auto", "thread"], help="env_mode values")
    parser.add_argument("--delay", type=float, default=0.1, help="seconds per step of the delay environment")
    parser.add_argument("--games", type=int, default=4, help="distinct w2-o3-q4 training games")
    args = parser.parse_args()

    from trl_multiturn.data import textworld_tasks
    from trl_multiturn.testing import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(os.path.join(tmp, "tiny"))
        print(f"Delay environment ({args.delay * 1000:.0f} ms per step), {args.episodes} episodes x {args.turns} "
              f"turns, tiny model, {os.cpu_count()} CPU cores\n")
        print("| env_mode | wall (s) | generation (s) | lockstep bound (s) | wall / bound |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for mode in args.modes:
            wall, generation = delay_rollout(args.episodes, args.turns, mode, args.delay, model_dir)
            bound = generation + args.turns * args.delay
            print(f"| {mode} | {wall:.2f} | {generation:.2f} | {bound:.2f} | {wall / bound:.2f} |", flush=True)

        games_dir = os.path.join(tmp, "games")
        tasks = list(textworld_tasks(2, 3, 4, split="train", num_games=args.games, games_dir=games_dir))
        print(f"\nTextWorld w2-o3-q4, {args.episodes} episodes x {args.turns} turns, {os.cpu_count()} CPU cores\n")
        print("| env_mode | env steps/s | collator episodes/s | turns/s | sampled tokens/s |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for mode in args.modes:
            steps = env_steps_per_second(tasks, args.episodes, args.turns, mode, games_dir)
            eps, turns, tokens = collator_throughput(tasks, args.episodes, args.turns, mode, games_dir, model_dir)
            print(f"| {mode} | {steps:.0f} | {eps:.2f} | {turns:.1f} | {tokens:.0f} |", flush=True)


if __name__ == "__main__":
    main()
