"""How unequal two ranks' packed forwards are, and what placing whole groups on ranks by their cost would win; not a
test. The question behind it: should a planner move groups (GRPO's rows of one prompt; step-wise, an episode's steps)
between ranks so that each rank forwards as many tokens (issue 63, item 4)? This measures the imbalance that exists.

    nice -n 19 python benchmarks/packing_ranks.py --out benchmarks/results/packing_ranks.json

Rows: the shapes of benchmarks/packing.py (real prompts and observations tokenized by SmolLM2-135M-Instruct's
tokenizer and chat template, random admissible replies), as a step of a two-process run lays them out:

- ALFWorld GRPO recipe (recipes/alfworld_grpo.yaml: groups of 8, per_device_train_batch_size 8, 4 accumulation
  steps, so 32 rows = 4 groups per rank): its fixture game, each episode cut at a turn count drawn from 1..--max-turns
  (episodes end when won, failed or at max_turns; the recipe allows 24); the fixture holds one game, so every group
  starts from the same prompt, as no two of a real run's tasks do;
- TextWorld quickstart (recipes/quickstart.yaml: groups of 4, 8 rows per rank = 2 groups): one generated w1-o2-q2
  game per group, 1..4 turns each;
- SWE-Gym-sized: groups of 8 replies (1-4 commands) to a prompt whose observation holds 500..2,100 tokens (a slice
  of this repository's source from a random offset, so groups share the system prompt alone), 2 groups per rank;
- step-wise ALFWorld, `window:2` and `full` history: 4 episodes per rank, 1..20 turns each, one row per turn.

Placements: TRL's (accelerate hands rank r the r-th contiguous slice of the generation batch, so the r-th run of
groups) and the longest-processing-time greedy one (groups by their own packed cost, largest first, each to the rank
with the least cost so far among those holding fewer than their share of groups: every rank keeps TRL's row count).
Per rank: its rows planned as `Forwards.old` plans them (`plan_packs`, batch_size = per_device_train_batch_size, the
cost model of SmolLM2's widths under SDPA), its forwards, forwarded tokens and cost (`PackPlan.packed_cost`); the ranks
agree on the busiest one's forwards, so a step's old-log-prob pass takes about the costliest rank's cost. Reported per
scenario over --steps random steps: the costliest rank over the mean rank (1.0: balanced), TRL's placement against
the greedy one, and the forwards each rank plans.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import packing as bench  # noqa: E402  (benchmarks/packing.py: its shapes' episodes and row builders)

RANKS = 2


def plan_of(rows, batch_size, rho, kernel):
    from trl_multiturn.trainers.packing import plan_packs

    ids, mask, keep = bench.padded_batch(rows)
    return plan_packs(ids, mask, keep, batch_size, rho=rho, kernel=kernel)


def trl_placement(groups: list) -> list[list]:
    """Rank r holds the r-th contiguous run of groups (accelerate's split of TRL's generation batch)."""
    share = len(groups) // RANKS
    return [groups[r * share:(r + 1) * share] for r in range(RANKS)]


def greedy_placement(groups: list, costs: list[float]) -> list[list]:
    """Longest processing time first, each rank taking len(groups) / RANKS groups: groups by cost, largest first,
    each to the rank with the least cost so far that still has room."""
    share = len(groups) // RANKS
    ranks, loads = [[] for _ in range(RANKS)], [0.0] * RANKS
    for g in sorted(range(len(groups)), key=lambda g: -costs[g]):
        r = min((r for r in range(RANKS) if len(ranks[r]) < share), key=lambda r: loads[r])
        ranks[r].append(groups[g])
        loads[r] += costs[g]
    return ranks


def rank_numbers(placement, batch_size, rho, kernel) -> list[dict]:
    out = []
    for groups in placement:
        plan = plan_of([row for group in groups for row in group], batch_size, rho, kernel)
        out.append({"forwards": len(plan.forwards), "tokens": plan.forwarded_tokens, "cost": plan.packed_cost})
    return out


def scenario(name, make_groups, batch_size, steps, rho, kernel) -> dict:
    """`steps` random steps of `make_groups(rng)` (a step's groups, TRL's order) on two ranks, both placements."""
    rng = random.Random(name)
    runs = []
    for _ in range(steps):
        groups = make_groups(rng)
        costs = [plan_of(group, batch_size, rho, kernel).packed_cost for group in groups]
        trl = rank_numbers(trl_placement(groups), batch_size, rho, kernel)
        greedy = rank_numbers(greedy_placement(groups, costs), batch_size, rho, kernel)
        runs.append({"trl": trl, "greedy": greedy})

    def imbalance(ranks):
        costs = [r["cost"] for r in ranks]
        return max(costs) / statistics.mean(costs)

    trl_imbalance = [imbalance(run["trl"]) for run in runs]
    greedy_imbalance = [imbalance(run["greedy"]) for run in runs]
    gain = [max(r["cost"] for r in run["trl"]) / max(r["cost"] for r in run["greedy"]) for run in runs]
    fillers = [max(r["forwards"] for r in run["trl"]) - min(r["forwards"] for r in run["trl"]) for run in runs]
    return {"scenario": name, "steps": steps, "runs": runs,
            "trl_imbalance": {"median": statistics.median(trl_imbalance), "max": max(trl_imbalance)},
            "greedy_imbalance": {"median": statistics.median(greedy_imbalance), "max": max(greedy_imbalance)},
            "step_gain": {"median": statistics.median(gain), "max": max(gain)},
            "filler_forwards": {"median": statistics.median(fillers), "max": max(fillers)},
            "forwards_per_rank": statistics.mean(r["forwards"] for run in runs for r in run["trl"]),
            "tokens_per_rank": statistics.mean(r["tokens"] for run in runs for r in run["trl"])}


def main() -> None:
    command = "python benchmarks/packing_ranks.py " + " ".join(sys.argv[1:])  # before ALFWorld's import rewrites it
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="random steps per scenario")
    parser.add_argument("--max-turns", type=int, default=12, help="most turns of an ALFWorld GRPO episode")
    parser.add_argument("--out", default=None, help="write the numbers as JSON here")
    args = parser.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trl_multiturn.cache import cache_dir
    from trl_multiturn.envs import ALFWorldEnv, TextWorldEnv
    from trl_multiturn.envs.alfworld import list_tasks
    from trl_multiturn.envs.textworld.tasks import textworld_tasks
    from trl_multiturn.models import offline_default_model
    from trl_multiturn.rollout.chat_tokens import ChatTokenBuilder
    from trl_multiturn.trainers.packing import attention_cost_ratio
    from trl_multiturn.trainers.tree_attention import attention_kernel

    path = offline_default_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = AutoConfig.from_pretrained(path, num_hidden_layers=1)  # the cost model reads the widths alone
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    rho, kernel = attention_cost_ratio(model), attention_kernel(model.config._attn_implementation)
    builder = ChatTokenBuilder(tokenizer)
    rng = random.Random(0)

    alf = ALFWorldEnv(admissible_commands=True)
    alf_task = list_tasks(bench.ALFWORLD_FIXTURE)[0]
    alf_pool = [bench.play(alf, alf_task, max(args.max_turns, 20), rng) for _ in range(24)]
    alf.close()
    games_dir = str(cache_dir("textworld_games"))
    games = textworld_tasks(1, 2, 2, split="train", num_games=8, games_dir=games_dir, progress=False)
    tw = TextWorldEnv(games_dir=games_dir)
    tw_pool = [[bench.play(tw, dict(game), 4, rng) for _ in range(6)] for game in games]
    tw.close()
    source = "\n\n".join(p.read_text() for p in sorted((bench.ROOT / "trl_multiturn" / "rollout").glob("*.py")))
    source_ids = tokenizer(source, add_special_tokens=False)["input_ids"]
    commands = ["view src/app.py 1 40", "run pytest -q tests/test_app.py", "submit",
                "replace 'return a - b' with 'return a + b' in src/app.py", "run ls -la src"]

    def cut(episode, turns):
        return episode[0], episode[1][:turns]

    def alfworld_groups(r):
        return [bench.trajectory_rows(builder, tokenizer, bench.ALF_SYSTEM,
                                      [cut(ep, r.randint(1, args.max_turns)) for ep in r.sample(alf_pool, 8)])
                for _ in range(4 * RANKS)]

    def textworld_groups(r):
        return [bench.trajectory_rows(builder, tokenizer, bench.TW_SYSTEM,
                                      [cut(ep, r.randint(1, 4)) for ep in r.sample(pool, 4)])
                for pool in r.sample(tw_pool, 2 * RANKS)]

    def swe_groups(r):
        groups = []
        for _ in range(2 * RANKS):
            start, length = r.randrange(len(source_ids) - 2100), r.randint(500, 2100)  # a task's own text
            text = tokenizer.decode(source_ids[start:start + length])
            prompt = builder.prompt_ids([{"role": "system", "content": bench.SWE_SYSTEM},
                                         {"role": "user", "content": text}])
            groups.append([(prompt, bench.reply_ids(tokenizer, " ".join(r.choice(commands)
                                                                        for _ in range(r.randint(1, 4)))))
                           for _ in range(8)])
        return groups

    def stepwise_groups(history):
        return lambda r: [bench.stepwise_rows(builder, tokenizer, bench.ALF_SYSTEM, cut(ep, r.randint(1, 20)), history)
                          for ep in r.sample(alf_pool, 4 * RANKS)]

    scenarios = [("ALFWorld GRPO, 4 groups of 8 per rank", alfworld_groups, 8),
                 ("TextWorld quickstart, 2 groups of 4 per rank", textworld_groups, 8),
                 ("SWE-Gym-sized, 2 groups of 8 per rank", swe_groups, 8),
                 ("step-wise window:2, 4 episodes per rank", stepwise_groups("window:2"), 8),
                 ("step-wise full, 4 episodes per rank", stepwise_groups("full"), 8)]
    results = []
    print(f"{'scenario':46} {'fwd/rank':>8} {'tok/rank':>8} {'TRL max/mean':>14} {'greedy max/mean':>15} "
          f"{'TRL/greedy':>12} {'fillers':>8}")
    for name, make, batch_size in scenarios:
        result = scenario(name, make, batch_size, args.steps, rho, kernel)
        results.append(result)
        print(f"{name:46} {result['forwards_per_rank']:>8.1f} {result['tokens_per_rank']:>8.0f} "
              f"{result['trl_imbalance']['median']:>6.3f} ({result['trl_imbalance']['max']:.2f}) "
              f"{result['greedy_imbalance']['median']:>7.3f} ({result['greedy_imbalance']['max']:.2f}) "
              f"{result['step_gain']['median']:>5.3f} ({result['step_gain']['max']:.2f}) "
              f"{result['filler_forwards']['median']:>4} ({result['filler_forwards']['max']})", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": command, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
