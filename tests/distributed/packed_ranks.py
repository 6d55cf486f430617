"""Run under `torchrun --nproc_per_node 2`: prefix packing on two processes against one process. Each rank holds
rows that pack into a different number of forwards (rank 0 one GRPO group sharing a prompt, rank 1 rows sharing
nothing), computes a token-summed policy-gradient loss over its rows through `Forwards.logps` (the trainers' path:
each rank packs its own rows, the ranks agree on one number of forwards), and backpropagates through the model
replicated by DDP, then sharded by FSDP2. One process's reference: the same loss over every rank's rows, padded, on an
unwrapped copy of the model. Then the same with a Qwen3.5-shaped model (Gated DeltaNet layers), whose rows share
their prefixes by forked layer states (`packing_states`): rank 0's group forks into two forwards (the prompt, then
the replies continued from its states), rank 1's rows into one; the reference is one process's forked run over every
rank's rows. Then PPO's loss forward of a Qwen3.5-shaped policy and critic (`model_families.build_critic`) under
DDP: each rank plans its rows as the PPO trainer does (`Forwards.plan`: forked forwards of both models, agreed), runs
policy and critic continued from their forked states (`ppo.policy_and_values`), rank 1 a filler forward through both;
the reference is one process's forked run of both over every rank's rows. Rank 0 writes, per model and backend, each
rank's planned and run forwards and the largest differences of log-probs (and values), loss and gradients from the
reference.

Then planning that fails on one rank alone, with no further collective after it: a Mistral-shaped model whose
sliding window (24 tokens) is shorter than rank 0's rows (a 30-token prompt) and longer than rank 1's under
`packing="prefix"` (refused on rank 0 only), a planner that raises on rank 1 only, and the hybrid model's forked plan
of rows whose mask has a hole on rank 0 only. Each rank writes the error
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

from trl_multiturn.model_families import build_critic, build_model, family
from trl_multiturn.trainers.forwards import Forwards
from trl_multiturn.trainers.logprobs import sequence_logps
from trl_multiturn.trainers.packing import choose_plan, plan_packs
from trl_multiturn.trainers.packing_states import forked_logps_and_entropies
from trl_multiturn.trainers.ppo import policy_and_values
from trl_multiturn.trainers.value_model import PolicyAndValueModel

model_path, out = sys.argv[1], Path(sys.argv[2])
accelerator = Accelerator(cpu=True)
rank, world = accelerator.process_index, accelerator.num_processes
T = 0.7  # temperature
BATCH_SIZE = 2  # TRL's chunk: a forward holds at most two padded rows' tokens
FORKED_BATCH_SIZE = 4  # rank 1's four roots in one forked forward


def ranks_rows(seed=0):
    """Every rank's (prompt, completion) rows: rank 0 a group of four replies to one prompt (few forwards), rank 1
    four rows of one length with their own prompts (one packed forward per two rows; one forked forward)."""
    rng = random.Random(seed)

    def tokens(n):
        return [rng.randrange(3, 500) for _ in range(n)]

    prompt = tokens(30)
    group = [(prompt, tokens(rng.randint(3, 6))) for _ in range(4)]
    n, m = rng.randint(8, 14), rng.randint(3, 6)  # one length: forked, the four roots need no padding
    alone = [(tokens(n), tokens(m)) for _ in range(4)]
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


def load_hybrid():
    return build_model(family("Qwen3.5")).train()


everyone = ranks_rows()
tokens = sum(len(c) for rows in everyone for _, c in rows)
advantages = [torch.linspace(-1, 1, len(rows)) for rows in everyone]
ref_ids, ref_mask, ref_keep = padded([row for rows in everyone for row in rows])
ref_completion = ref_mask[:, -ref_keep:].float()
ids, mask, keep = padded(everyone[rank])
completion = mask[:, -keep:].float()
starts = [0, len(everyone[0])]


def reference(model, logps_of):
    """One process: every rank's rows through a plain `model` (`logps_of(model, ids, mask, keep)`): this rank's rows'
    log-probs, the loss and its gradients."""
    ref_logps = logps_of(model, ref_ids, ref_mask, ref_keep)
    ref_loss = loss_of(ref_logps, ref_completion, torch.cat(advantages), tokens)
    ref_loss.backward()
    return (ref_logps.detach()[starts[rank]: starts[rank] + len(everyone[rank])], ref_loss.detach(),
            {name: p.grad for name, p in model.named_parameters()})


def run(model, backend, grads_of, expected, batch_size=BATCH_SIZE, pad_token_id=0):
    """This rank's packed loss through `model` (wrapped by `backend`), backpropagated; the comparison with
    `expected`, one process's (`reference`)."""
    ref_rows, ref_loss, ref_grads = expected
    forwards = Forwards(lambda: model, lambda: None, accelerator, types.SimpleNamespace(packing="prefix"),
                        temperature=T, pad_token_id=pad_token_id)
    agree, planned, calls = forwards.agree, [], []
    forwards.agree = lambda plan, *error: (planned.append(len(plan.forwards)), agree(plan, *error))[1]
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    logps = forwards.logps(model, ids, mask, keep, batch_size)[0]
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
        # relative to each gradient's scale where it exceeds 1 (model_matrix._grads_differ): the hybrid model's
        # largest gradients are about 12, and its one-process forked and padded gradients differ by 1e-4 there
        "grads": max(float((grads[name] - ref).abs().max() / max(1.0, float(ref.abs().max())))
                     for name, ref in ref_grads.items()),
        "backend": backend,
    }


from torch.distributed.fsdp import fully_shard  # noqa: E402


def sharded(model):
    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)


def ddp_grads(model):
    return {n: p.grad for n, p in model.module.named_parameters()}


def fsdp_grads(model):
    return {n: p.grad.full_tensor() for n, p in model.named_parameters()}


results = {"packed": [], "forked": []}
expected = reference(load(), lambda *rows: sequence_logps(*rows, temperature=T)[0])
results["packed"].append(run(accelerator.prepare(load()), "ddp", ddp_grads, expected))
results["packed"].append(run(sharded(load()), "fsdp", fsdp_grads, expected))
# the hybrid model, forked on one process (exact against its padded rows: tests/trainers/test_packing_states.py)
pad_id = load_hybrid().config.pad_token_id
expected = reference(load_hybrid(), lambda *rows: forked_logps_and_entropies(
    *rows, FORKED_BATCH_SIZE, temperature=T, pad_token_id=pad_id)[0])
results["forked"].append(run(accelerator.prepare(load_hybrid()), "ddp", ddp_grads, expected, FORKED_BATCH_SIZE,
                             pad_id))
results["forked"].append(run(sharded(load_hybrid()), "fsdp", fsdp_grads, expected, FORKED_BATCH_SIZE, pad_id))



def load_ppo():
    policy = load_hybrid()
    return PolicyAndValueModel(policy, build_critic(policy))


def ppo_loss(logps, values, completion_mask, advantages):
    """A policy-gradient loss and a value term over the completion tokens, both models' gradients in one backward."""
    return loss_of(logps, completion_mask, advantages, tokens) + loss_of(values, completion_mask, -advantages, tokens)


def ppo_reference():
    """One process: PPO's loss forward of both models over every rank's rows, forked (exact against the padded rows:
    tests/trainers/test_ppo_packing.py): this rank's log-probs and values, the loss and its gradients."""
    model = load_ppo()
    plan = choose_plan((model.policy, model.critic), ref_ids, ref_mask, ref_keep, packing="prefix")
    logps, _, values = policy_and_values(model, ref_ids, ref_mask, ref_keep, temperature=T, plan=plan)
    loss = ppo_loss(logps, values, ref_completion, torch.cat(advantages))
    loss.backward()
    mine = slice(starts[rank], starts[rank] + len(everyone[rank]))
    return logps.detach()[mine], values.detach()[mine], loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def run_ppo(expected):
    """This rank's PPO loss forward through both models under DDP (`Forwards.plan`, as the PPO trainer plans it),
    backpropagated; the comparison with `expected` (`ppo_reference`)."""
    ref_logps, ref_values, ref_loss, ref_grads = expected
    model = accelerator.prepare(load_ppo())
    forwards = Forwards(lambda: model, lambda: None, accelerator, types.SimpleNamespace(packing="prefix"),
                        temperature=T, pad_token_id=pad_id)
    agree, planned, calls = forwards.agree, [], []
    forwards.agree = lambda plan, *error: (planned.append(len(plan.forwards)), agree(plan, *error))[1]
    hook = model.module.critic.register_forward_pre_hook(lambda *_: calls.append(1))
    plan = forwards.plan(ids, mask, keep, None)
    logps, _, values = policy_and_values(model, ids, mask, keep, temperature=T, plan=plan)
    hook.remove()
    loss = ppo_loss(logps, values, completion, advantages[rank]) * world
    loss.backward()
    total = accelerator.reduce(loss.detach() / world, reduction="sum")
    grads = ddp_grads(model)
    return {
        "plan": type(plan).__name__,
        "planned": planned,
        "forwards": len(calls),  # the critic's: each a forward of the policy's too
        "logps": float(((logps.detach() - ref_logps[:, :keep]) * completion).abs().max()),
        "values": float(((values.detach() - ref_values[:, :keep]) * completion).abs().max()),
        "loss": float((total - ref_loss).abs()),
        "grads": max(float((grads[name] - ref).abs().max() / max(1.0, float(ref.abs().max())))
                     for name, ref in ref_grads.items()),
    }


results["ppo"] = run_ppo(ppo_reference())

gathered = [None] * world
dist.all_gather_object(gathered, results)
if rank == 0:
    (out / "result.json").write_text(json.dumps(gathered))
accelerator.wait_for_everyone()


def raised(model, planner=None, rows_mask=mask):
    """The error this rank's `Forwards.logps` of its rows (`rows_mask` their mask) raises under `packing="prefix"`
    ("Type: message") or None."""
    forwards = Forwards(lambda: model, lambda: None, accelerator, types.SimpleNamespace(packing="prefix"),
                        temperature=T, pad_token_id=0)
    forwards.planner = planner or forwards.planner
    try:
        forwards.logps(model, ids, rows_mask, keep, BATCH_SIZE)
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
holed = mask.clone()  # rank 0's first row with a hole in its prompt: its forked plan fails on rank 0 alone
holed[0, -keep - 2] = 0 if rank == 0 else holed[0, -keep - 2]
refusals = [raised(windowed), raised(load(), fails_on_rank_1), raised(load_hybrid(), rows_mask=holed)]
(out / f"refusals{rank}.json").write_text(json.dumps(refusals))
accelerator.end_training()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skip interpreter finalisation, as tests/distributed/equal_generate_calls.py explains
