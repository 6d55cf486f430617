"""Packing on several processes (trl_multiturn/trainers/packing.py `with_filler_forwards`, forwards.py
`Forwards.agree`): filler forwards change no row's output and bring a rank's plan to the busiest rank's number of
forwards; the agreement packs only where every rank packs. Two real processes: tests/trainers/test_distributed.py."""

import random
import types

import pytest
import torch
from test_packing import batch, grouped
from test_ppo_packing import policy_and_critic
from transformers import AutoModelForCausalLM

from trl_multiturn.trainers.forwards import Forwards
from trl_multiturn.trainers.packing import (
    packed_logps_and_entropies,
    packed_policy_and_values,
    plan_packs,
    with_filler_forwards,
)

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
