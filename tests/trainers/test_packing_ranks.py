"""Packing on several processes (trl_multiturn/trainers/packing.py `with_filler_forwards`, forwards.py
`Forwards.agree`): filler forwards change no row's output and bring a rank's plan to the busiest rank's number of
forwards, packed and forked (a hybrid model's layer states); the agreement packs only where every rank packs. Two real
processes: tests/trainers/test_distributed.py."""

import contextlib
import random
import types

import pytest
import torch
from test_packing import batch, grouped
from test_ppo_packing import policy_and_critic
from transformers import AutoModelForCausalLM

from trl_multiturn.model_families import build_model, family
from trl_multiturn.trainers.forwards import Forwards
from trl_multiturn.trainers.logprobs import sequence_logps
from trl_multiturn.trainers.model_matrix import _batch
from trl_multiturn.trainers.packing import (
    packed_logps_and_entropies,
    packed_policy_and_values,
    plan_packs,
    with_filler_forwards,
)
from trl_multiturn.trainers.packing_states import forked_logps_and_entropies

T = 0.7


@pytest.fixture(scope="module")
def model(tiny_chatml_model):
    return AutoModelForCausalLM.from_pretrained(tiny_chatml_model, attn_implementation="sdpa", dtype=torch.float32)


def test_filler_forwards_leave_every_row_and_its_gradient_as_the_plan_gives_them(model):
    ids, mask, keep = batch(grouped(random.Random(0), prompt_len=20))
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        results = {}
        for extra in (0, 3):
            model.zero_grad()
            calls.clear()
            logps, entropies = packed_logps_and_entropies(
                model, ids, mask, keep, compute_entropy=True, temperature=T, packing="prefix",
                agree=lambda plan, extra=extra: with_filler_forwards(plan, len(plan.forwards) + extra))
            (logps * mask[:, -keep:]).sum().backward()
            results[extra] = (logps.detach(), entropies, model.lm_head.weight.grad.clone(), len(calls))
    finally:
        hook.remove()
    (logps, entropies, grad, planned), (filled_logps, filled_entropies, filled_grad, run) = results[0], results[3]
    assert run == planned + 3
    assert torch.equal(filled_logps, logps) and torch.equal(filled_entropies, entropies)
    assert torch.allclose(filled_grad, grad, atol=1e-7) and grad.abs().sum() > 0


def test_filler_forwards_leave_ppo_policy_and_critic_outputs_and_gradients_as_they_are(tiny_chatml_model):
    model = policy_and_critic(tiny_chatml_model)
    ids, mask, keep = batch(grouped(random.Random(1), prompt_len=12))
    plan = plan_packs(ids, mask, keep)
    results = []
    for agreed in (plan, with_filler_forwards(plan, len(plan.forwards) + 2)):
        model.zero_grad()
        outputs = packed_policy_and_values(model, agreed, temperature=T)
        sum((out * mask[:, -keep:]).sum() for out in outputs).backward()
        results.append([out.detach() for out in outputs] + [p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*results))


def test_a_plan_is_never_filled_below_its_own_forwards():
    ids, mask, keep = batch([([5, 6, 7], [8, 9]), ([10, 11], [12])])
    plan = plan_packs(ids, mask, keep, batch_size=1)
    assert len(with_filler_forwards(plan, len(plan.forwards)).forwards) == len(plan.forwards)
    with pytest.raises(ValueError, match="cannot be filled"):
        with_filler_forwards(plan, len(plan.forwards) - 1)


class OtherRank:
    """A fake accelerator of rank 0 of two processes: `reduce(max)` meets what the other rank (`other`, the pair
    (failed, padded, forwards) that `Forwards.agree` sends) holds; the real collective runs in test_distributed.py."""

    num_processes, device = 2, torch.device("cpu")
    autocast = staticmethod(contextlib.nullcontext)

    def __init__(self, other):
        self.other = torch.tensor(other)

    def reduce(self, tensor, reduction):
        assert reduction == "max"
        return torch.maximum(tensor, self.other)


@pytest.mark.parametrize("other, packed, forwards", [((0, 0, 5), True, 5), ((0, 0, 0), True, None),
                                                           ((0, 1, 0), False, None)])
def test_ranks_pack_only_together_and_run_the_busiest_ranks_forwards(other, packed, forwards):
    ids, mask, keep = batch([([5, 6, 7], [8, 9]), ([10, 11], [12])])
    plan = plan_packs(ids, mask, keep, batch_size=1)
    agreed = Forwards(lambda: None, lambda: None, OtherRank(other), types.SimpleNamespace(packing="prefix"),
                      temperature=T, pad_token_id=0).agree(plan)
    assert (agreed is not None) == packed
    if packed:
        assert len(agreed.forwards) == (forwards or len(plan.forwards))
        assert agreed.forwards[:len(plan.forwards)] == plan.forwards and torch.equal(agreed.index, plan.index)


@pytest.mark.parametrize("other, forks", [((0, 0, 4), True), ((0, 1, 0), False)])
def test_a_hybrid_model_forks_where_every_rank_forks_with_fillers_up_to_the_busiest_rank(other, forks):
    """`packing="prefix"` on rank 0 of two (`OtherRank`): an LFM2-shaped model's group sharing a prompt forks into two
    forwards; where the other rank forks into four, two filler forwards follow them, and the log-probs, entropies and
    gradients are those of the forked run on one process; where the other rank pads, so does this one (its padded
    rows to the bit)."""
    model = build_model(family("LFM2")).train()
    rng = random.Random(2)
    prompt = [rng.randrange(100, 300) for _ in range(12)]
    ids, mask, keep = _batch([(prompt, [rng.randrange(100, 300) for _ in range(3)]) for _ in range(4)], "cpu")
    pad_id = model.config.pad_token_id
    results = []
    for several in (True, False):
        model.zero_grad()
        calls = []
        hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
        if several:
            logps, entropies, _ = Forwards(lambda: model, lambda: None, OtherRank(other),
                                           types.SimpleNamespace(packing="prefix"), temperature=T,
                                           pad_token_id=pad_id).logps(model, ids, mask, keep, compute_entropy=True)
        elif forks:
            logps, entropies = forked_logps_and_entropies(model, ids, mask, keep, compute_entropy=True,
                                                          temperature=T, pad_token_id=pad_id)
        else:
            logps, entropies = sequence_logps(model, ids, mask, keep, temperature=T, compute_entropy=True)[:2]
        hook.remove()
        ((logps + entropies) * mask[:, -keep:]).sum().backward()
        results.append((logps.detach(), entropies.detach(), [p.grad.clone() for p in model.parameters()], len(calls)))
    (logps, entropies, grads, run), (own_logps, own_entropies, own_grads, own_run) = results
    assert run == (4 if forks else 1) and own_run == (2 if forks else 1)
    assert torch.equal(logps, own_logps) and torch.equal(entropies, own_entropies)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, own_grads, strict=True))
