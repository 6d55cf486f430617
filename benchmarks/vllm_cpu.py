"""vLLM (CPU, colocate) against transformers generation on the same multi-turn rollouts. Prints a table; not a test.

    bash scripts/setup_vllm.sh && .venv-vllm/bin/python benchmarks/vllm_cpu.py        # 16 episodes, 4 turns

Both backends are `MultiTurnGRPOTrainer`'s own (`use_vllm=True, vllm_mode="colocate"` and the default transformers
path) with SmolLM2-135M-Instruct on the same TextWorld w1-o2-q2 games: the runner plays `--episodes` episodes
(one generate call per turn for all live ones, at most `--reply-tokens` per reply), and sampled tokens per second
count the model's own tokens (env_mask 1) over the rollout's wall time, environment steps included. Repetitions
alternate between the backends so that a change in the machine's load hits both. Also reports the engine build
(the trainer's `__init__` with vLLM against without) and the first rollout, which includes vLLM's graph capture.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def build_trainer(use_vllm: bool, episodes: int, turns: int, reply_tokens: int, games_dir: str, tasks, out: str):
    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
    from trl_multiturn.envs import TextWorldEnv
    from trl_multiturn.models import offline_default_model

    args = MultiTurnGRPOConfig(
        output_dir=out, max_turns=turns, num_generations=2, per_device_train_batch_size=episodes,
        max_completion_length=reply_tokens, use_cpu=True, bf16=False, report_to="none", seed=0, temperature=1.0,
        use_vllm=use_vllm, vllm_mode="colocate",
        system_prompt="You are playing a text adventure game. Reply with a single command, such as 'go north'.",
    )
    start = time.perf_counter()
    trainer = MultiTurnGRPOTrainer(model=offline_default_model(), args=args, train_dataset=tasks,
                                   environment_factory=lambda: TextWorldEnv(games_dir=games_dir))
    return trainer, time.perf_counter() - start


def rollout(trainer, rows) -> tuple[int, float, int]:
    """(sampled tokens, seconds, turns) of one batch of episodes."""
    start = time.perf_counter()
    episodes = trainer.episode_runner(rows)
    elapsed = time.perf_counter() - start
    return sum(sum(ep.env_mask) for ep in episodes), elapsed, sum(ep.num_turns for ep in episodes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--reply-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()

    from trl_multiturn.envs.textworld.tasks import textworld_tasks

    work = tempfile.mkdtemp(prefix="vllm_cpu_bench_")
    games_dir = os.path.join(work, "games")
    tasks = textworld_tasks(1, 2, 2, split="train", num_games=options.episodes // 2, games_dir=games_dir)
    rows = [tasks[i // 2] for i in range(options.episodes)]
    settings = (options.episodes, options.turns, options.reply_tokens, games_dir, tasks)
    hf, hf_init = build_trainer(False, *settings, os.path.join(work, "hf"))
    vllm, vllm_init = build_trainer(True, *settings, os.path.join(work, "vllm"))
    first = rollout(vllm, rows)  # includes the engine's first-call graph capture (dynamo tracing)
    rollout(hf, rows)  # warm-up
    runs = {"transformers": [], "vLLM (CPU, colocate)": []}
    for _ in range(options.repeats):
        for name, trainer in (("vLLM (CPU, colocate)", vllm), ("transformers", hf)):
            runs[name].append(rollout(trainer, rows))

    print(f"\nSmolLM2-135M-Instruct, TextWorld w1-o2-q2, {options.episodes} episodes x up to {options.turns} turns, "
          f"<= {options.reply_tokens} tokens per reply, {options.repeats} repeats (median), load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"trainer __init__: {hf_init:.1f} s with transformers, {vllm_init:.1f} s with vLLM (engine build); "
          f"first vLLM rollout {first[1]:.1f} s (graph capture included)\n")
    print("| backend | sampled tokens | turns | rollout s | sampled tokens/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    rates = {}
    for name, results in runs.items():
        tokens, seconds, turns = (statistics.median(r[k] for r in results) for k in range(3))
        rates[name] = statistics.median(r[0] / r[1] for r in results)
        print(f"| {name} | {tokens:.0f} | {turns:.0f} | {seconds:.1f} | {rates[name]:.1f} |")
    print(f"\nvLLM / transformers: {rates['vLLM (CPU, colocate)'] / rates['transformers']:.2f}x")


if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    main()
