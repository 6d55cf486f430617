"""Prefix-tree packing against padded rows (trl_multiturn/trainers/packing.py): forwarded tokens, wall time per
optimizer step and peak memory on the same rows; not a test.

    nice -n 10 python benchmarks/packing.py --layers 2 --out benchmarks/results/packing.json   # the committed table
    python benchmarks/packing.py                        # SmolLM2-135M whole (30 layers): for a machine with time
    python benchmarks/packing.py --tokens-only          # forwarded tokens alone (no model forward), seconds
    nice -n 10 python benchmarks/packing.py --layers 1 --trainer ppo --only '(b)' '(c)' '(d)'   # PPO's step
    nice -n 5 python benchmarks/packing.py --layers 1 --kernels --repeats 3   # per-segment attention against dense
    python benchmarks/packing.py --tokens-only --family "Gemma 3"   # a Gemma-3-shaped model (sliding windows)
    python benchmarks/packing.py --tokens-only --family Qwen3.5     # a Qwen3.5-shaped one (forked layer states)
    nice -n 19 python benchmarks/packing.py --family Qwen3.5 --trainer ppo --threads 1 --repeats 2 --alf-turns 4 \
        --turns 5 --only '(b)' '(d)' '(c)'             # PPO's step forked (benchmarks/results/packing_states.md)
    python benchmarks/packing.py --layers 1 --processes 2 --threads 1   # the step on two processes (torchrun)

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
all three forwards (`--family Qwen3.5 --trainer ppo`: a critic of the family's layers, `model_families.build_critic`,
and the policy and critic fork their layer states, the old log-probs' forward planned on its own). Each path of each
shape runs in a fresh process, and its memory is that process's peak resident set size (`getrusage` max RSS) above its
RSS just before the step: torch's CPU tensors are outside `tracemalloc`.
`--kernels` compares the packed path's two attention kernels on each shape (`tree_attention`: per segment, which
SDPA models take, against the dense 4-D tree mask, which eager models take): each plans the rows with the cost model
priced for that kernel (so the dense one may split a tree the per-segment one keeps whole), then times the decoder
layers' forward and backward over the plan's forwards (`model.model`, the LM head left out: the kernel changes the
attention only), median of `--repeats`, and counts the query-key pairs each computes against the tree's floor (each
token against its ancestors: sum over the prefix tree's nodes of depth + 1). The load average is recorded with them.
Per shape the token table also gives the query-key pairs one attention layer of each type computes (packed: the
per-segment kernel's, under the layer's window; padded: SDPA's B W^2, or B W (W + 1) / 2 where no row is padded, a
window cutting nothing there) against the floor (each prefix-tree token against its ancestors, those within the window
on a sliding layer), and the tokens on two processes (each rank its contiguous half of the rows, as accelerate splits
a batch, packing its own; fillers: the one-token forwards by which the ranks agree on one number of forwards).
`--family "Gemma 3"` / `--family Qwen3.5` run a tiny model of that family's shape instead of SmolLM2 (`SHAPED`, random
weights, SmolLM2's tokenizer and vocabulary so that the rows are the same): Gemma 3's windowed layers take the tree
mask cut to the window; Qwen3.5's Gated-DeltaNet layers cannot take a pack, so its rows share their prefixes by
forked layer states (`packing_states`: each prefix forwarded once, the branches continued from its states), whose
forwards are recorded from one no-grad run: real tokens, and the tokens of their batches with the padding; its
`auto` column is the path `packing="auto"` takes there (`packing.fork_cost`), the timed "packed" path the forked one.
`--processes 2` times the step under torchrun (gloo, DDP): each rank its half of the rows, the ranks agreeing on one
plan as the trainers do (`forwards.Forwards.agree`; a forking model's forked forwards too, the rank with fewer running
fillers); the slowest rank's time and the largest rank's memory, and the load average before each path's run.
`--layers N` keeps SmolLM2-135M's first N of 30 decoder layers (its real weights, widths, tokenizer and LM head):
on the shared 2-core machine the whole model ran about 9 tokens/s forward + backward, too slow for these shapes;
the ratios between the paths hold per layer, so they are what the table reports.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import shlex
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


SHAPED = {
    "Gemma 3": dict(num_hidden_layers=6, sliding_window=512,
                    layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    "Qwen3.5": dict(layer_types=["linear_attention"] * 3 + ["full_attention"]),
}
"""`--family`: the conformance matrix's tiny config of the family (trl_multiturn/model_families.py) in the shape of
its released models: Gemma 3's five sliding-window layers to one global one with Gemma 3 1B's window (512 tokens,
narrower than rows (a)-(c)), Qwen3.5's three Gated-DeltaNet layers to one attention layer."""

WIDTHS = dict(hidden_size=256, intermediate_size=512, head_dim=64, max_position_embeddings=8192)
"""The `--family` models' widths (benchmarks/packing_states.py's, with heads x head_dim = hidden), SmolLM2's
tokenizer's vocabulary (so that they read the same rows) and positions for the longest row."""


def load_model(layers: int | None, trainer: str = "grpo", family_name: str | None = None):
    """SmolLM2-135M (its first `layers` decoder layers), or `family_name`'s shaped tiny model (`SHAPED`, random
    weights, SmolLM2's tokenizer); for PPO with a critic beside it (`PolicyAndValueModel`; a family's: a
    token-classification model of its layers, `model_families.build_critic`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    from trl_multiturn.model_families import build_critic, build_model, family
    from trl_multiturn.models import offline_default_model
    from trl_multiturn.trainers.value_model import PolicyAndValueModel

    path = offline_default_model()
    if family_name is not None:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = build_model(family(family_name), tokenizer, **WIDTHS, **SHAPED[family_name])
        return (PolicyAndValueModel(model, build_critic(model)) if trainer == "ppo" else model), tokenizer
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
    """The packed path's forwarded tokens against the padded rows' and the limit, and the query-key pairs its
    attention computes per layer type against the floor (`attention_pairs`); for a model that forks its layer
    states (`packing_states`), those of its forked forwards (`forked_counts`)."""
    from trl_multiturn.trainers.packing import attention_cost_ratio, plan_packs
    from trl_multiturn.trainers.packing_states import forks_states
    from trl_multiturn.trainers.tree_attention import attention_kernel

    ids, mask, keep = padded_batch(rows)
    kernel = attention_kernel(model.config._attn_implementation)
    plan = plan_packs(ids, mask, keep, rho=attention_cost_ratio(model), kernel=kernel)
    counts = {"rows": len(rows), "padded": plan.padded_tokens, "limit": plan.distinct_tokens}
    if forks_states(model):
        return {**counts, **forked_counts(model, rows)}
    return {**counts, "packed": plan.forwarded_tokens, "packs": sum(f.input_ids.shape[0] for f in plan.forwards),
            "auto": "prefix" if plan.packed_cost < plan.padded_cost else "padded",
            "pairs": attention_pairs(model.config, rows, plan, kernel, mask)}


def layer_windows(config) -> dict[str, dict]:
    """Per attention layer type of `config` ("full_attention", "sliding_attention"), its window (None: the whole
    row) and number of layers; a model without `layer_types` has one type, "full_attention"."""
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    return {kind: {"window": config.sliding_window if kind == "sliding_attention" else None,
                   "layers": kinds.count(kind)}
            for kind in dict.fromkeys(kinds) if kind.endswith("attention") and kind != "linear_attention"}


def attention_pairs(config, rows, plan, kernel: str, mask) -> dict:
    """Per attention layer type: query-key pairs one such layer computes, packed (the per-segment kernel: each
    tile's queries against the keys `tree_attention.TreeLayout.keys_and_mask` gives it under the layer's window,
    n (n + 1) / 2 for a causal segment; the dense mask: k L^2 per forward) and padded (`padded_pairs`), and the floor
    (`ancestor_pairs` under the window)."""
    padded = padded_pairs(mask)
    out = {}
    for kind, spec in layer_windows(config).items():
        window = spec["window"]
        packed = 0
        for forward in plan.forwards:
            k, width = forward.input_ids.shape
            if kernel != "segments":
                packed += k * width * width
                continue
            for index, segment in enumerate(forward.layout.tiles(window)):
                positions, segment_mask = forward.layout.keys_and_mask(index, window, "cpu")
                packed += segment.n * (segment.n + 1) // 2 if positions is None else segment_mask.numel()
        out[kind] = {"layers": spec["layers"], "window": window, "packed": packed, "padded": padded,
                     "floor": ancestor_pairs(rows, window)}
    return out


def padded_pairs(mask) -> int:
    """Query-key pairs one attention layer computes over the padded rows (B, W): SDPA under a padding mask, B W^2,
    or causal where no row is padded, B W (W + 1) / 2 (a sliding window cuts nothing from either)."""
    B, W = mask.shape
    return B * W * (W + 1) // 2 if bool(mask.bool().all()) else B * W * W


def forked_counts(model, rows) -> dict:
    """The forwards `packing_states.forked_logps_and_entropies` runs on the rows (one no-grad run, its model calls
    recorded): real tokens forwarded, tokens of the forwards' (n, q) batches with their padding, and the query-key
    pairs of an attention layer, n q x kv per forward (SDPA over the batch's queries and the forked cache's keys
    under a padding mask; n q (q + 1) / 2 for a forward from no cache with nothing padded, which SDPA runs causal),
    the padded rows' (`padded_pairs`) beside them; "auto": the path `packing="auto"` takes (`packing.fork_cost`)."""
    import torch

    from trl_multiturn.trainers.packing import fork_cost
    from trl_multiturn.trainers.packing_states import forked_logps_and_entropies, plan_forks

    calls = []

    def record(module, args, kwargs):
        n, q = kwargs["input_ids"].shape
        mask = kwargs["attention_mask"]
        kv = mask.shape[1]
        # transformers runs SDPA causal, without a mask, where nothing is padded and there is no cache
        pairs = n * q * (q + 1) // 2 if kv == q and bool(mask.all()) else n * q * kv
        calls.append((n * q, pairs, int(mask[:, -q:].sum())))

    ids, mask, keep = padded_batch(rows)
    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            forked_logps_and_entropies(model, ids, mask, keep, temperature=1.0,
                                       pad_token_id=model.config.pad_token_id or 0)
    finally:
        hook.remove()
    padded_price, forked_price = fork_cost(model, plan_forks(ids, mask, keep), mask)
    return {"packed": sum(c[2] for c in calls), "batch_tokens": sum(c[0] for c in calls),
            "forwards": len(calls), "auto": "forked" if forked_price < padded_price else "padded",
            "pairs": {kind: {**spec, "packed": sum(c[1] for c in calls), "padded": padded_pairs(mask),
                             "floor": ancestor_pairs(rows, spec["window"])}
                      for kind, spec in layer_windows(model.config).items()}}


def two_process_counts(model, rows) -> dict:
    """Tokens on two processes: each rank takes its contiguous half of the rows (accelerate's split of a batch) and
    packs them (a forking model: forks them, `packing_states.plan_forks`); the ranks agree on one number of forwards
    (`forwards.Forwards.agree`: the rank with fewer runs filler forwards). Per rank its forwarded tokens (forked: the
    real tokens of its forwards), fillers and limit (its rows' prefix tree); with the whole batch's limit the cost of
    the prefixes the split puts on both ranks shows."""
    from trl_multiturn.trainers.packing import attention_cost_ratio, plan_packs
    from trl_multiturn.trainers.packing_states import forks_states, plan_forks
    from trl_multiturn.trainers.tree_attention import attention_kernel

    half = (len(rows) + 1) // 2
    ranks = []
    for part in (rows[:half], rows[half:]):
        ids, mask, keep = padded_batch(part)
        plan = plan_packs(ids, mask, keep, rho=attention_cost_ratio(model),
                          kernel=attention_kernel(model.config._attn_implementation))
        rank = {"rows": len(part), "packed": plan.forwarded_tokens, "forwards": len(plan.forwards),
                "limit": plan.distinct_tokens}
        if forks_states(model):
            forked = plan_forks(ids, mask, keep)
            rank.update(packed=sum(len(node.tokens) for f in forked.forwards for node in f.nodes),
                        forwards=len(forked.forwards))
        ranks.append(rank)
    most = max(rank["forwards"] for rank in ranks)
    return {"ranks": [{**rank, "fillers": most - rank["forwards"]} for rank in ranks]}


def one_step(model, rows, packing: str, agree=None) -> float:
    """Seconds of one optimizer step's forwards and backward: the no-grad old log-probs, then the loss. `agree`: the
    ranks' agreement on one plan (`forwards.Forwards.agree`) on several processes."""
    import torch

    from trl_multiturn.model_layers import text_config
    from trl_multiturn.trainers.packing import attention_cost_ratio, packed_logps_and_entropies, plan_packs
    from trl_multiturn.trainers.packing_states import forks_states
    from trl_multiturn.trainers.tree_attention import attention_kernel

    ids, mask, keep = padded_batch(rows)
    completion_mask = mask[:, -keep:].float()
    advantages = torch.linspace(-1, 1, len(rows))[:, None]
    start = time.perf_counter()
    plan = None
    if packing == "prefix" and not forks_states(model):  # a forking model's rows take no plan
        plan = plan_packs(ids, mask, keep, rho=attention_cost_ratio(model),
                          kernel=attention_kernel(text_config(model)._attn_implementation))

    def logps(compute_entropy):
        return packed_logps_and_entropies(model, ids, mask, keep, compute_entropy=compute_entropy, packing=packing,
                                          temperature=1.0, planner=lambda *args, **kwargs: plan, agree=agree)

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
        choose_plan,
        packed_logps_and_entropies,
        packed_values,
        plan_packs,
    )
    from trl_multiturn.trainers.packing_states import forks_states
    from trl_multiturn.trainers.ppo import clipped_surrogate, clipped_value_loss, masked_mean, policy_and_values

    ids, mask, keep = padded_batch(rows)
    completion_mask = mask[:, -keep:]
    advantages = torch.linspace(-1, 1, len(rows))[:, None].expand(-1, keep)
    start = time.perf_counter()
    plan = None
    if packing == "prefix" and forks_states(model):  # a hybrid policy and critic: forked forwards of both
        plan = choose_plan((model.policy, model.critic), ids, mask, keep, packing="prefix")
    elif packing == "prefix":  # policy and critic load with SDPA: the per-segment kernel
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


def ancestor_pairs(rows, window: int | None = None) -> int:
    """The floor of attention: each distinct prefix-tree token against itself and its ancestors, sum of depth + 1
    over the tree's nodes (in lexicographic order a row adds the nodes past its common prefix with the row before);
    under a sliding `window`, against the ancestors less than `window` positions above it, min(depth + 1, window)."""
    total, prev = 0, []
    for row in sorted(p + c for p, c in rows):
        common = len(os.path.commonprefix([prev, row]))
        total += sum(min(d + 1, window or d + 1) for d in range(common, len(row)))
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
    """Child process: one path on one shape; prints a JSON line. Under torchrun (`--processes 2`) each rank takes its
    contiguous half of the rows, the model replicated by DDP (gloo), and the ranks agree on their plans
    (`forwards.Forwards.agree`); rank 0 prints every rank's figures."""
    import torch

    torch.set_num_threads(args.threads)
    model, _ = load_model(args.layers, args.trainer, args.family)
    rows = json.loads(Path(args.rows_file).read_text())[args.shape]
    agree, accelerator = None, None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import types

        from accelerate import Accelerator

        from trl_multiturn.trainers.forwards import Forwards

        accelerator = Accelerator(cpu=True)
        half = (len(rows) + 1) // 2
        rows = rows[:half] if accelerator.process_index == 0 else rows[half:]
        model = accelerator.prepare(model)
        agree = Forwards(lambda: model, lambda: None, accelerator, types.SimpleNamespace(packing=args.path),
                         temperature=1.0, pad_token_id=0).agree
    step = one_ppo_step if args.trainer == "ppo" else functools.partial(one_step, agree=agree)
    before = rss_mb()
    times = [step(model, rows, args.path) for _ in range(args.repeats)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"seconds": statistics.median(times), "times": times, "peak_rss_mb": peak,
              "peak_above_start_mb": peak - before}
    if accelerator is None:
        print(json.dumps(result))
        return
    import torch.distributed as dist

    ranks = [None] * accelerator.num_processes
    dist.all_gather_object(ranks, result)
    if accelerator.is_main_process:  # the slowest rank's time, the largest rank's memory
        print(json.dumps({"seconds": max(r["seconds"] for r in ranks),
                          "peak_above_start_mb": max(r["peak_above_start_mb"] for r in ranks), "ranks": ranks}))
    accelerator.wait_for_everyone()
    accelerator.end_training()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch's exit-time destructors can abort a gloo rank (tests/distributed/equal_generate_calls.py)


def main() -> None:
    command = "python benchmarks/packing.py " + shlex.join(sys.argv[1:])  # before ALFWorld's import rewrites sys.argv
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
    parser.add_argument("--family", choices=sorted(SHAPED), default=None,
                        help="a family-shaped tiny model (`SHAPED`) instead of SmolLM2-135M (--layers is ignored)")
    parser.add_argument("--processes", type=int, choices=[1, 2], default=1,
                        help="time the step on this many CPU processes (torchrun, gloo, DDP; each rank its half of "
                             "the rows, --threads threads each)")
    parser.add_argument("--games-dir", default=None)
    parser.add_argument("--out", default=None, help="write the table's data as JSON here")
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--rows-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.processes > 1 and (args.trainer != "grpo" or args.kernels):
        parser.error("--processes 2 times GRPO's step (--trainer grpo, without --kernels)")
    if args.games_dir is None:
        from trl_multiturn.cache import cache_dir

        args.games_dir = str(cache_dir("textworld_games"))
    if args.shape:
        return measure(args)
    model, tokenizer = load_model(args.layers, family_name=args.family)
    all_rows = shapes(args, tokenizer)
    rows_file = Path(tempfile.mkdtemp()) / "rows.json"
    rows_file.write_text(json.dumps(all_rows))
    results = []
    print(f"{'shape':42} {'rows':>4} {'padded':>7} {'packed':>7} {'limit':>7} {'packed/limit':>12} "
          f"{'padded/packed':>13} {'auto':>6}")
    for name, rows in all_rows.items():
        counts = token_counts(model, rows)
        counts["two_processes"] = two_process_counts(model, rows)
        results.append({"shape": name, **counts})
        print(f"{name:42} {counts['rows']:>4} {counts['padded']:>7} {counts['packed']:>7} {counts['limit']:>7} "
              f"{counts['packed'] / counts['limit']:>12.3f} {counts['padded'] / counts['packed']:>13.2f} "
              f"{counts['auto']:>6}" + (f" ({counts['forwards']} forwards of {counts['batch_tokens']} tokens with "
                                        "their padding)" if "batch_tokens" in counts else ""), flush=True)
    print(f"\n{'shape':42} {'layers':>18} {'packed pairs':>13} {'floor':>11} {'packed/floor':>12} "
          f"{'padded/floor':>12}")
    for result in results:
        for kind, p in result["pairs"].items():
            print(f"{result['shape']:42} {kind + ' x' + str(p['layers']):>18} {p['packed']:>13,} {p['floor']:>11,} "
                  f"{p['packed'] / p['floor']:>12.2f} {p['padded'] / p['floor']:>12.2f}")
    print(f"\n{'two processes':42} {'rank packed/limit':>22} {'fillers':>7} {'sum packed/limit':>16}")
    for result in results:
        ranks = result["two_processes"]["ranks"]
        split = " ".join(f"{r['packed']}/{r['limit']}" for r in ranks)
        print(f"{result['shape']:42} {split:>22} {' '.join(str(r['fillers']) for r in ranks):>7} "
              f"{sum(r['packed'] + r['fillers'] for r in ranks) / result['limit']:>16.3f}")
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
        key = ("step" if args.trainer == "grpo" else f"{args.trainer}_step") + (
            "_two_processes" if args.processes == 2 else "")  # in the results JSON
        print(f"\n{args.trainer} step")
        print(f"{'shape':42} {'padded s':>9} {'packed s':>9} {'speed-up':>8} {'padded MB':>9} {'packed MB':>9}")
        for result in timed:
            for path in ("padded", "prefix"):
                launcher = [sys.executable] if args.processes == 1 else [
                    str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node",
                    str(args.processes)]
                child = [*launcher, __file__, "--shape", result["shape"], "--path", path, "--rows-file",
                         str(rows_file), "--repeats", str(args.repeats), "--threads", str(args.threads),
                         "--trainer", args.trainer] + (
                    ["--layers", str(args.layers)] if args.layers else []) + (
                    ["--family", args.family] if args.family else [])
                load_average = os.getloadavg()[0]
                done = subprocess.run(child, capture_output=True, text=True, check=True,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)})
                result.setdefault(key, {})[path] = {**json.loads(done.stdout.strip().splitlines()[-1]),
                                                    "load_average": load_average}
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
