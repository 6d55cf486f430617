"""Run under `torchrun --nproc_per_node 2`: prefix packing on two processes against one process. Each rank holds
rows that pack into a different number of forwards (rank 0 one GRPO group sharing a prompt, rank 1 rows sharing
nothing), computes a token-summed policy-gradient loss over its rows through `Forwards.logps` (the trainers' path:
each rank packs its own rows, the ranks agree on one number of forwards), and backpropagates through the model
replicated by DDP, then sharded by FSDP2. One process's reference: the same loss over every rank's rows, padded, on an
unwrapped copy of the model. Rank 0 writes, per backend, each rank's planned and run forwards and the largest
differences of log-probs, loss and gradients from the reference.

Then planning that fails on one rank alone, with no further collective after it: a Mistral-shaped model whose
sliding window (24 tokens) is shorter than rank 0's rows (a 30-token prompt) and longer than rank 1's under
`packing="prefix"` (refused on rank 0 only), and a planner that raises on rank 1 only. Each rank writes the error
each case raised there (`refusals{rank}.json`), or None where its forwards ran."""

import json
import os
import random
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, MistralConfig
from trl.trainer.utils import pad

from trl_multiturn.trainers.forwards import Forwards
from trl_multiturn.trainers.logprobs import sequence_logps
from trl_multiturn.trainers.packing import plan_packs

model_path, out = sys.argv[1], Path(sys.argv[2])
accelerator = Accelerator(cpu=True)
rank, world = accelerator.process_index, accelerator.num_processes
T = 0.7  # temperature
BATCH_SIZE = 2  # TRL's chunk: a forward holds at most two padded rows' tokens


def ranks_rows(seed=0):
    """Every rank's (prompt, completion) rows: rank 0 a group of four replies to one prompt (few forwards), rank 1
    four rows with their own prompts (one forward each)."""
    rng = random.Random(seed)

    def tokens(n):
        return [rng.randrange(3, 500) for _ in range(n)]

    prompt = tokens(30)
    group = [(prompt, tokens(rng.randint(3, 6))) for _ in range(4)]
    alone = [(tokens(rng.randint(8, 14)), tokens(rng.randint(3, 6))) for _ in range(4)]
    return [group, alone]


def padded(rows):
    prompts = [torch.tensor(p) for p, _ in rows]
    completions = [torch.tensor(c) for _, c in rows]
    ids = torch.cat([pad(prompts, 0, "left"), pad(completions, 0, "right")], 1)
    mask = torch.cat([pad([torch.ones_like(p) for p in prompts], 0, "left"),
                      pad([torch.ones_like(c) for c in completions], 0, "right")], 1)
    return ids, mask, max(len(c) for _, c in rows)


def loss_of(logps, mask, advantages, tokens):
    """Token-summed policy-gradient loss over the global token count (TRL's "dapo" normaliser)."""
    return -(logps * advantages[:, None] * mask).sum() / tokens


def load():
    return AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa", dtype=torch.float32)


everyone = ranks_rows()
tokens = sum(len(c) for rows in everyone for _, c in rows)
advantages = [torch.linspace(-1, 1, len(rows)) for rows in everyone]

# one process: every rank's rows, padded, through a plain model
reference = load()
ref_ids, ref_mask, ref_keep = padded([row for rows in everyone for row in rows])
ref_logps = sequence_logps(reference, ref_ids, ref_mask, ref_keep, temperature=T)[0]
ref_completion = ref_mask[:, -ref_keep:].float()
ref_loss = loss_of(ref_logps, ref_completion, torch.cat(advantages), tokens)
ref_loss.backward()
ref_grads = {name: p.grad for name, p in reference.named_parameters()}

ids, mask, keep = padded(everyone[rank])
completion = mask[:, -keep:].float()
starts = [0, len(everyone[0])]
ref_rows = ref_logps.detach()[starts[rank]: starts[rank] + len(everyone[rank])]


def run(model, backend, grads_of):
    """This rank's packed loss through `model` (wrapped by `backend`), backpropagated; the comparison."""
    forwards = Forwards(lambda: model, lambda: None, accelerator, types.SimpleNamespace(packing="prefix"),
                        temperature=T, pad_token_id=0)
    agree, planned, calls = forwards.agree, [], []
    forwards.agree = lambda plan, *error: (planned.append(len(plan.forwards)), agree(plan, *error))[1]
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    logps = forwards.logps(model, ids, mask, keep, BATCH_SIZE)[0]
    hook.remove()
    # DDP and FSDP average the ranks' gradients: each rank's loss counts `world` times
    loss = loss_of(logps, completion, advantages[rank], tokens) * world
    loss.backward()
    total = accelerator.reduce(loss.detach() / world, reduction="sum")
    grads = grads_of(model)
    # a row's completion starts at the first kept column in both layouts
    logps_error = ((logps.detach() - ref_rows[:, :keep]) * completion).abs().max()
    return {
        "planned": planned,
        "forwards": len(calls),
        "logps": float(logps_error),
        "loss": float((total - ref_loss).abs()),
        "grads": max(float((grads[name] - ref_grads[name]).abs().max()) for name in ref_grads),
        "backend": backend,
    }


results = []
ddp = accelerator.prepare(load())
results.append(run(ddp, "ddp", lambda m: {n: p.grad for n, p in m.module.named_parameters()}))

from torch.distributed.fsdp import fully_shard  # noqa: E402

sharded = load()
for layer in sharded.model.layers:
    fully_shard(layer)
fully_shard(sharded)
results.append(run(sharded, "fsdp", lambda m: {n: p.grad.full_tensor() for n, p in m.named_parameters()}))

gathered = [None] * world
dist.all_gather_object(gathered, results)
if rank == 0:
    (out / "result.json").write_text(json.dumps(gathered))
accelerator.wait_for_everyone()


def raised(model, planner=None):
    """The error this rank's `Forwards.logps` of its rows raises under `packing="prefix"` ("Type: message") or None."""
    forwards = Forwards(lambda: model, lambda: None, accelerator, types.SimpleNamespace(packing="prefix"),
                        temperature=T, pad_token_id=0)
    forwards.planner = planner or forwards.planner
    try:
        forwards.logps(model, ids, mask, keep, BATCH_SIZE)
    except Exception as error:  # noqa: BLE001 - the test compares the ranks' errors
        return f"{type(error).__name__}: {error}"
    return None


def fails_on_rank_1(*args, **kwargs):
    if rank == 1:
        raise RuntimeError("no plan on rank 1")
    return plan_packs(*args, **kwargs)


windowed = AutoModelForCausalLM.from_config(MistralConfig(
    vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, sliding_window=24), attn_implementation="sdpa")
refusals = [raised(windowed), raised(load(), fails_on_rank_1)]
(out / f"refusals{rank}.json").write_text(json.dumps(refusals))
accelerator.end_training()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skip interpreter finalisation, as tests/distributed/equal_generate_calls.py explains
