"""Prefix-tree packing against padded rows (trl_multiturn/trainers/packing.py): forwarded tokens, wall time per
optimizer step and peak memory on the same rows; not a test.

    nice -n 10 python benchmarks/packing.py --layers 2 --out benchmarks/results/packing.json   # the committed table
    python benchmarks/packing.py                        # SmolLM2-135M whole (30 layers): for a machine with time
    python benchmarks/packing.py --tokens-only          # forwarded tokens alone (no model forward), seconds
    nice -n 10 python benchmarks/packing.py --layers 1 --trainer ppo --only '(b)' '(c)' '(d)'   # PPO's step
    nice -n 5 python benchmarks/packing.py --layers 1 --kernels --repeats 3   # per-segment attention against dense

Rows: real prompts and observations, tokenized by SmolLM2-135M-Instruct's tokenizer and chat template
(`offline:smollm2-135m-instruct`) the way the rollout builds them (`ChatTokenBuilder`); each episode's replies are
random admissible commands of the real environment (ALFWorld's fixture game, a TextWorld quickstart game) rather than
a policy's samples, so a group's episodes diverge from their first reply, as sampled ones mostly do.

(a) ALFWorld GRPO recipe (recipes/alfworld_grpo.yaml): its system prompt, the game's first observation with the
    admissible actions, a group of 8 episodes, trajectory format, `--alf-turns` turns each.
(b) SWE-Gym-sized: a 2,000+ token prompt (this repository's source as the text: SWE-Gym's length, not its words) and a
    group of 8 short single replies (16-48 tokens).
(c) Step-wise rows of one ALFWorld episode over `--turns` turns (one row per turn: the context the history keeps and
    the reply), `window:2` and `full` history; forwarded tokens also at 5 and 10 turns to show how they grow.
(d) TextWorld quickstart (recipes/quickstart.yaml): its system prompt, a w1-o2-q2 game, a group of 4, 4 turns.

Per shape: forwarded tokens of each path (padded: B x W, TRL's padded rows; packed: real tokens in the packs) and the
limit (the rows' prefix-tree size), then one optimizer step per path: the no-grad old-log-prob forward and the loss's
forward + backward (a clipped policy-gradient loss over the completion tokens), timed as wall seconds, median of
`--repeats`; the packed path's planning (`plan_packs`, once per step, shared by both forwards) is inside its time.
`--trainer ppo` times PPO's step instead: the no-grad old log-probs and the critic's values (`packing.packed_values`
against the padded rows' critic forward), then the loss's forward of policy and critic (`ppo.policy_and_values`, one
forward of each) and its backward (the clipped surrogate plus the clipped value loss); the critic is a
token-classification model of the same layers (its own copy), as `MultiTurnPPOTrainer` builds it, and one plan serves
all three forwards. Each path of each shape runs in a fresh process, and its memory is that process's peak resident
set size (`getrusage` max RSS) above its RSS just before the step: torch's CPU tensors are outside `tracemalloc`.
`--kernels` compares the packed path's two attention kernels on each shape (`tree_attention`: per segment, which
SDPA models take, against the dense 4-D tree mask, which eager models take): each plans the rows with the cost model
priced for that kernel (so the dense one may split a tree the per-segment one keeps whole), then times the decoder
layers' forward and backward over the plan's forwards (`model.model`, the LM head left out: the kernel changes the
attention only), median of `--repeats`, and counts the query-key pairs each computes against the tree's floor (each
token against its ancestors: sum over the prefix tree's nodes of depth + 1). The load average is recorded with them.
`--layers N` keeps SmolLM2-135M's first N of 30 decoder layers (its real weights, widths, tokenizer and LM head):
on the shared 2-core machine the whole model ran about 9 tokens/s forward + backward, too slow for these shapes;
the ratios between the paths hold per layer, so they are what the table reports.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
ALFWORLD_FIXTURE = ROOT / "tests" / "fixtures" / "alfworld"
ALF_SYSTEM = ("You are in a household. Reply with one action only, such as 'go to cabinet 1', 'open fridge 1', 'take "
              "apple 1 from countertop 1', 'heat apple 1 with microwave 1' or 'move apple 1 to diningtable 1'.")
TW_SYSTEM = ("You are playing a text adventure game. Reply with a single command, such as 'go north', 'take key' or "
             "'open chest'.")
SWE_SYSTEM = ("You are fixing a bug in a Python repository. Reply with one action: view a file, run a command, edit "
              "a file or submit.")


def load_model(layers: int | None, trainer: str = "grpo"):
    """SmolLM2-135M (its first `layers` decoder layers); for PPO with a critic beside it (`PolicyAndValueModel`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    from trl_multiturn.models import offline_default_model
    from trl_multiturn.trainers.value_model import PolicyAndValueModel

    path = offline_default_model()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)
    if trainer == "ppo":
        critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, attn_implementation="sdpa",
                                                                 dtype=torch.float32)
        model = PolicyAndValueModel(model, critic)
    for part in [model.policy, model.critic] if trainer == "ppo" else [model]:
        if layers:
            part.base_model.layers = part.base_model.layers[:layers]
            part.config.num_hidden_layers = layers
    return model, AutoTokenizer.from_pretrained(path)


def play(env, task, turns: int, rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """The first observation and `turns` (random admissible action, observation) pairs of a real episode."""
    first = env.reset(task)
    actions = ["look", "inventory"]
    played = []
    for _ in range(turns):
        action = rng.choice(actions)
        result = env.step(action)
        played.append((action, result.observation))
        actions = result.info.get("admissible_commands") or actions
        if result.done:
            first_again = env.reset(task)
            assert first_again == first
    return first, played


def reply_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def trajectory_rows(builder, tokenizer, system, episodes) -> list[tuple[list[int], list[int]]]:
    """One row per episode: the prompt, then every reply and the observation after it (the trajectory format)."""
    rows = []
    for first, played in episodes:
        prompt = builder.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": first}])
        completion = []
        for k, (action, observation) in enumerate(played):
            completion += reply_ids(tokenizer, action)
            if k + 1 < len(played):
                completion += builder.observation_ids(observation)
        rows.append((prompt, completion))
    return rows


def stepwise_rows(builder, tokenizer, system, episode, history) -> list[tuple[list[int], list[int]]]:
    """One row per turn of one episode: the context the history policy keeps, rendered whole, and the reply."""
    from trl_multiturn.rollout.history import get_history

    policy = get_history(history)
    first, played = episode
    opening = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    turns = [[{"role": "assistant", "content": a}, {"role": "user", "content": o}] for a, o in played]
    return [(builder.prompt_ids(policy(opening, turns[:k])), reply_ids(tokenizer, action))
            for k, (action, _) in enumerate(played)]


def shapes(args, tokenizer) -> dict[str, list]:
    from trl_multiturn.envs import ALFWorldEnv, TextWorldEnv
    from trl_multiturn.envs.alfworld import list_tasks
    from trl_multiturn.envs.textworld.tasks import textworld_tasks
    from trl_multiturn.rollout.chat_tokens import ChatTokenBuilder

    builder = ChatTokenBuilder(tokenizer)
    rng = random.Random(0)
    alf = ALFWorldEnv(admissible_commands=True)
    alf_task = list_tasks(ALFWORLD_FIXTURE)[0]
    out = {"(a) ALFWorld GRPO, group of 8": trajectory_rows(
        builder, tokenizer, ALF_SYSTEM, [play(alf, alf_task, args.alf_turns, rng) for _ in range(8)])}
    source = "\n\n".join(p.read_text() for p in sorted((ROOT / "trl_multiturn" / "rollout").glob("*.py")))
    ids = tokenizer(source, add_special_tokens=False)["input_ids"][:args.swe_prompt]
    prompt = builder.prompt_ids([{"role": "system", "content": SWE_SYSTEM},
                                 {"role": "user", "content": tokenizer.decode(ids)}])
    commands = ["view src/app.py 1 40", "run pytest -q tests/test_app.py", "submit",
                "replace 'return a - b' with 'return a + b' in src/app.py", "run ls -la src"]
    out["(b) SWE-Gym-sized prompt, group of 8"] = [
        (prompt, reply_ids(tokenizer, " ".join(rng.choice(commands) for _ in range(rng.randint(1, 4)))))
        for _ in range(8)]
    episode = play(alf, alf_task, max(args.turns, 20), rng)
    for turns in sorted({5, 10, args.turns}):
        cut = (episode[0], episode[1][:turns])
        for history in ("window:2", "full"):
            out[f"(c) step-wise {history}, {turns} turns"] = stepwise_rows(builder, tokenizer, ALF_SYSTEM, cut,
                                                                          history)
    alf.close()
    games = textworld_tasks(1, 2, 2, split="train", num_games=1, games_dir=args.games_dir, progress=False)
    tw = TextWorldEnv(games_dir=args.games_dir)
    out["(d) TextWorld quickstart, group of 4"] = trajectory_rows(
        builder, tokenizer, TW_SYSTEM, [play(tw, dict(games[0]), 4, rng) for _ in range(4)])
    tw.close()
    return out


def padded_batch(rows):
    import torch
    from trl.trainer.utils import pad

    prompts = [torch.tensor(p) for p, _ in rows]
    completions = [torch.tensor(c) for _, c in rows]
    ids = torch.cat([pad(prompts, padding_value=0, padding_side="left"),
                     pad(completions, padding_value=0, padding_side="right")], 1)
    mask = torch.cat([pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
                      pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right")], 1)
    return ids, mask, max(len(c) for _, c in rows)


def token_counts(model, rows) -> dict:
    from trl_multiturn.trainers.packing import attention_cost_ratio, plan_packs
    from trl_multiturn.trainers.tree_attention import attention_kernel

    ids, mask, keep = padded_batch(rows)
    plan = plan_packs(ids, mask, keep, rho=attention_cost_ratio(model),
                      kernel=attention_kernel(model.config._attn_implementation))
    return {"rows": len(rows), "padded": plan.padded_tokens, "packed": plan.forwarded_tokens,
            "limit": plan.distinct_tokens, "packs": sum(f.input_ids.shape[0] for f in plan.forwards),
            "auto": "prefix" if plan.packed_cost < plan.padded_cost else "padded"}


def one_step(model, rows, packing: str) -> float:
    """Seconds of one optimizer step's forwards and backward: the no-grad old log-probs, then the loss."""
    import torch

    from trl_multiturn.trainers.packing import attention_cost_ratio, packed_logps_and_entropies, plan_packs
    from trl_multiturn.trainers.tree_attention import attention_kernel

    ids, mask, keep = padded_batch(rows)
    completion_mask = mask[:, -keep:].float()
    advantages = torch.linspace(-1, 1, len(rows))[:, None]
    start = time.perf_counter()
    plan = None
    if packing == "prefix":
        plan = plan_packs(ids, mask, keep, rho=attention_cost_ratio(model),
                          kernel=attention_kernel(model.config._attn_implementation))

    def logps(compute_entropy):
        return packed_logps_and_entropies(model, ids, mask, keep, compute_entropy=compute_entropy, packing=packing,
                                          temperature=1.0, planner=lambda *args, **kwargs: plan)

    with torch.no_grad():
        old, _ = logps(False)
    new, entropy = logps(True)
    ratio = torch.exp(new - old)
    loss = -(torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages) * completion_mask).sum()
    (loss / completion_mask.sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def one_ppo_step(model, rows, packing: str) -> float:
    """Seconds of one PPO optimizer step's forwards and backward: the no-grad old log-probs and critic values, then
    the loss's forward of policy and critic (clipped surrogate + 0.1 x clipped value loss) and its backward."""
    import torch

    from trl_multiturn.trainers.packing import (
        attention_cost_ratio,
        packed_logps_and_entropies,
        packed_values,
        plan_packs,
    )
    from trl_multiturn.trainers.ppo import clipped_surrogate, clipped_value_loss, masked_mean, policy_and_values

    ids, mask, keep = padded_batch(rows)
    completion_mask = mask[:, -keep:]
    advantages = torch.linspace(-1, 1, len(rows))[:, None].expand(-1, keep)
    start = time.perf_counter()
    plan = None
    if packing == "prefix":  # policy and critic load with SDPA: the per-segment kernel
        plan = plan_packs(ids, mask, keep, rho=attention_cost_ratio(model), kernel="segments")
    with torch.no_grad():
        old, _ = packed_logps_and_entropies(model, ids, mask, keep, packing=packing, temperature=1.0,
                                            planner=lambda *args, **kwargs: plan)
        if plan is not None:
            old_values = packed_values(model, plan)
        else:
            old_values = model(input_ids=ids, attention_mask=mask, output="values")[:, -keep - 1:-1]
    logps, _, values = policy_and_values(model, ids, mask, keep, temperature=1.0, plan=plan)
    surrogate, _ = clipped_surrogate(torch.exp(logps - old), advantages, 0.2, 0.2)
    value_loss, _ = clipped_value_loss(values, old_values, old_values + advantages, completion_mask, 0.2)
    (masked_mean(surrogate, completion_mask) + 0.1 * value_loss).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def ancestor_pairs(rows) -> int:
    """The floor of attention: each distinct prefix-tree token against itself and its ancestors, sum of depth + 1
    over the tree's nodes (in lexicographic order a row adds the nodes past its common prefix with the row before)."""
    total, prev = 0, []
    for row in sorted(p + c for p, c in rows):
        common = len(os.path.commonprefix([prev, row]))
        total += sum(d + 1 for d in range(common, len(row)))
        prev = row
    return total


def kernel_times(model, rows, repeats: int) -> dict:
    """Per kernel ("dense", "segments"): forwarded tokens, packs, attention pairs computed, and the decoder layers'
    forward + backward seconds (each run, and their median) over the plan's forwards."""

    from trl_multiturn.trainers import packing

    ids, mask, keep = padded_batch(rows)
    rho = packing.attention_cost_ratio(model)
    out = {"floor_pairs": ancestor_pairs(rows)}
    for kernel in ("dense", "segments"):
        plan = packing.plan_packs(ids, mask, keep, rho=rho, kernel=kernel)
        pairs = sum(f.layout.pairs if kernel == "segments" else f.input_ids.shape[0] * f.input_ids.shape[1] ** 2
                    for f in plan.forwards)
        packing.attention_kernel = lambda implementation, kernel=kernel: kernel  # the kernel `model_inputs` passes
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for forward in plan.forwards:
                inputs = packing.model_inputs(model, forward)
                model.model(**inputs, use_cache=False).last_hidden_state.square().mean().backward()
            times.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        out[kernel] = {"forwarded": plan.forwarded_tokens, "packs": sum(f.input_ids.shape[0] for f in plan.forwards),
                       "pairs": pairs, "seconds": statistics.median(times), "times": times,
                       "cost": plan.packed_cost, "padded_cost": plan.padded_cost}
    return out


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(args) -> None:
    """Child process: one path on one shape; prints a JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    model, _ = load_model(args.layers, args.trainer)
    rows = json.loads(Path(args.rows_file).read_text())[args.shape]
    step = one_ppo_step if args.trainer == "ppo" else one_step
    before = rss_mb()
    times = [step(model, rows, args.path) for _ in range(args.repeats)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": statistics.median(times), "times": times, "peak_rss_mb": peak,
                      "peak_above_start_mb": peak - before}))


def main() -> None:
    command = "python benchmarks/packing.py " + " ".join(sys.argv[1:])  # before ALFWorld's import rewrites sys.argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=None, help="keep SmolLM2's first N decoder layers (all: None)")
    parser.add_argument("--turns", type=int, default=20, help="turns of the step-wise episode (c)")
    parser.add_argument("--timed-turns", type=int, default=None, help="turns of the timed (c) rows (--turns)")
    parser.add_argument("--alf-turns", type=int, default=6, help="turns of each ALFWorld episode (a)")
    parser.add_argument("--swe-prompt", type=int, default=2100, help="tokens of (b)'s observation")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens-only", action="store_true")
    parser.add_argument("--trainer", choices=["grpo", "ppo"], default="grpo",
                        help="whose step to time: GRPO's (old log-probs, loss) or PPO's (old log-probs and values, "
                             "the loss of policy and critic)")
    parser.add_argument("--kernels", action="store_true",
                        help="time the packed path's attention kernels (per segment, dense mask) instead of the step")
    parser.add_argument("--only", nargs="*", help="time these shapes alone, e.g. --only '(b)' '(d)'")
    parser.add_argument("--games-dir", default=None)
    parser.add_argument("--out", default=None, help="write the table's data as JSON here")
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--rows-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.games_dir is None:
        from trl_multiturn.cache import cache_dir

        args.games_dir = str(cache_dir("textworld_games"))
    if args.shape:
        return measure(args)
    model, tokenizer = load_model(args.layers)
    all_rows = shapes(args, tokenizer)
    rows_file = Path(tempfile.mkdtemp()) / "rows.json"
    rows_file.write_text(json.dumps(all_rows))
    results = []
    print(f"{'shape':42} {'rows':>4} {'padded':>7} {'packed':>7} {'limit':>7} {'packed/limit':>12} "
          f"{'padded/packed':>13} {'auto':>6}")
    for name, rows in all_rows.items():
        counts = token_counts(model, rows)
        results.append({"shape": name, **counts})
        print(f"{name:42} {counts['rows']:>4} {counts['padded']:>7} {counts['packed']:>7} {counts['limit']:>7} "
              f"{counts['packed'] / counts['limit']:>12.3f} {counts['padded'] / counts['packed']:>13.2f} "
              f"{counts['auto']:>6}", flush=True)
    if args.kernels:
        import torch

        torch.set_num_threads(args.threads)
        print(f"\n{'shape':42} {'kernel':>8} {'packs':>5} {'tokens':>6} {'pairs':>11} {'pairs/floor':>11} "
              f"{'fwd+bwd s':>9}  runs  load")
        for result in results:
            if args.only and result["shape"][:3] not in args.only:
                continue
            load_before = os.getloadavg()[0]
            result["kernels"] = kernel_times(model, all_rows[result["shape"]], args.repeats)
            result["kernels"]["load_average"] = [load_before, os.getloadavg()[0]]
            for kernel in ("dense", "segments"):
                k = result["kernels"][kernel]
                print(f"{result['shape']:42} {kernel:>8} {k['packs']:>5} {k['forwarded']:>6} {k['pairs']:>11,} "
                      f"{k['pairs'] / result['kernels']['floor_pairs']:>11.2f} {k['seconds']:>9.2f}  "
                      f"{' '.join(f'{t:.2f}' for t in k['times'])}  {load_before:.1f}", flush=True)
    elif not args.tokens_only:
        turns = args.timed_turns or args.turns
        timed = [r for r in results if (not r["shape"].startswith("(c)") or r["shape"].endswith(f" {turns} turns"))
                 and (not args.only or r["shape"][:3] in args.only)]
        key = "step" if args.trainer == "grpo" else f"{args.trainer}_step"  # in the results JSON
        print(f"\n{args.trainer} step")
        print(f"{'shape':42} {'padded s':>9} {'packed s':>9} {'speed-up':>8} {'padded MB':>9} {'packed MB':>9}")
        for result in timed:
            for path in ("padded", "prefix"):
                child = [sys.executable, __file__, "--shape", result["shape"], "--path", path, "--rows-file",
                         str(rows_file), "--repeats", str(args.repeats), "--threads", str(args.threads),
                         "--trainer", args.trainer] + (
                    ["--layers", str(args.layers)] if args.layers else [])
                done = subprocess.run(child, capture_output=True, text=True, check=True,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)})
                result.setdefault(key, {})[path] = json.loads(done.stdout.strip().splitlines()[-1])
            pad, pack = result[key]["padded"], result[key]["prefix"]
            print(f"{result['shape']:42} {pad['seconds']:>9.2f} {pack['seconds']:>9.2f} "
                  f"{pad['seconds'] / pack['seconds']:>7.2f}x {pad['peak_above_start_mb']:>9.0f} "
                  f"{pack['peak_above_start_mb']:>9.0f}", flush=True)
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k not in ("shape", "path", "rows_file", "out", "games_dir")}
        Path(args.out).write_text(json.dumps({"command": command, "settings": settings, "results": results},
                                             indent=1) + "\n")


if __name__ == "__main__":
    main()
