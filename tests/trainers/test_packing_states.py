"""Prefix sharing by forking layer states (trl_multiturn/trainers/packing_states.py): on trees the conformance
matrix's rows do not make (a row that is another's prefix, a branch point one token after another, several roots,
one-token leaves, a budget of one row per forward), in training mode, log-probs and entropies equal each row's own
forward and the gradients the padded rows'. The families' six configs are checked on the matrix's rows by
tests/trainers/test_model_matrix.py."""

import random

import pytest
import torch

from trl_multiturn.model_families import build_model, family
from trl_multiturn.trainers.logprobs import sequence_logps
from trl_multiturn.trainers.model_matrix import ATOL, TEMPERATURE, _alone, _batch, _grads_differ, _loss_grads
from trl_multiturn.trainers.packing_states import (
    PAD_SHARE,
    ForkPlan,
    forked_forwards,
    forked_logps_and_entropies,
    forks_states,
    plan_forks,
)
from trl_multiturn.trainers.value_model import PolicyAndValueModel, create_value_model


def _rows():
    rng = random.Random(3)

    def tokens(n):
        return [rng.randrange(100, 300) for _ in range(n)]

    p1, p2, p3, reply, other = tokens(10), tokens(7), tokens(7), tokens(6), tokens(4)
    return [(p1, reply), (p1, reply[:5] + tokens(1)),  # branches one token before their end
            (p1, reply[:5]),  # a row that is the prefix of two others
            (p1[:6], tokens(3)),  # a branch inside the first prompt
            (p1 + reply[:2], tokens(3)),  # ... and inside a reply
            (p2, tokens(1)), (p2, other), (p2, other[:1] + tokens(3)),  # a one-token leaf, a one-token branch node
            (p3, tokens(2)), (p3, tokens(5))]  # two roots of one length: their branches forked in one forward


@pytest.mark.parametrize("name", ["Qwen3.5", "Nemotron-H"])
@pytest.mark.parametrize("batch_size", [None, 1])
def test_forked_rows_equal_their_own_forwards_and_the_padded_gradients(name, batch_size):
    """Gated DeltaNet (Qwen3.5) and Mamba2 (Nemotron-H, whose one-token decode kernel updates its state in place:
    a one-token node is re-forwarded by its children instead). Shared tokens are forwarded once: fewer real tokens
    reach the model than the rows hold."""
    model = build_model(family(name)).train()
    rows = _rows()
    ids, mask, keep = _batch(rows, "cpu")
    with torch.no_grad():
        own_logps, own_entropies = _alone(model, rows, "cpu")
    forwarded = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: forwarded.append(int((args[0] != model.config.pad_token_id).sum())))
    logps, entropies = forked_logps_and_entropies(model, ids, mask, keep, batch_size, compute_entropy=True,
                                                  temperature=TEMPERATURE, pad_token_id=model.config.pad_token_id)
    hook.remove()
    assert sum(forwarded) < sum(len(p) + len(c) for p, c in rows)
    real = mask[:, -keep:].bool()
    assert (logps[~real] == 0).all() and (entropies[~real] == 0).all()
    torch.testing.assert_close(logps[real], own_logps[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(entropies[real], own_entropies[real], atol=ATOL, rtol=0)
    grads = _loss_grads(model, logps, entropies)
    padded = sequence_logps(model, ids, mask, keep, temperature=TEMPERATURE, compute_entropy=True)
    assert not _grads_differ(grads, _loss_grads(model, *padded[:2]), ATOL)


def test_siblings_of_unequal_lengths_are_batched_within_the_padding_share_and_stay_exact():
    """Nine replies of 1-21 tokens to one prompt, two of them sharing a stem: batched whole, siblings would be
    padded to the longest (2.0x the tree's tokens); cut by length (`packing_states._Batches`), the forwarded tokens,
    padding included, stay within 1 + PAD_SHARE of the tree's (and the one-token reply's second), the forwards are
    the ones `forked_forwards` prices, and every row's log-probs equal its own forward."""
    model = build_model(family("Qwen3.5")).train()
    rng = random.Random(7)

    def tokens(n):
        return [rng.randrange(100, 300) for _ in range(n)]

    prompt, stem = tokens(24), tokens(4)
    rows = [(prompt, tokens(n)) for n in (1, 2, 3, 5, 8, 13, 21)] + [(prompt, stem + tokens(6)),
                                                                    (prompt, stem + tokens(17))]
    ids, mask, keep = _batch(rows, "cpu")
    tree_tokens = len(prompt) + len(stem) + 6 + 17 + sum((1, 2, 3, 5, 8, 13, 21))
    shapes = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: shapes.append(args[0].shape))
    with torch.no_grad():
        logps, _ = forked_logps_and_entropies(model, ids, mask, keep, temperature=TEMPERATURE,
                                              pad_token_id=model.config.pad_token_id)
        hook.remove()
        own_logps, _ = _alone(model, rows, "cpu")
    assert [tuple(shape) for shape in shapes] == [(n, q) for n, q, _ in forked_forwards(plan_forks(ids, mask, keep))]
    assert sum(n * q for n, q in shapes) <= (1 + PAD_SHARE) * tree_tokens + 1  # the one-token reply: two wide
    assert max(n for n, _ in shapes) > 1  # siblings still share forwards where the share leaves room
    real = mask[:, -keep:].bool()
    torch.testing.assert_close(logps[real], own_logps[real], atol=ATOL, rtol=0)


def test_which_models_fork_their_states():
    """A hybrid model forks (through PEFT too, the matrix's LoRA column); an attention-only one does not need to;
    PPO's policy-and-critic module forks where both its models do (a critic built from a Qwen3-Next policy), not
    beside an attention-only critic."""
    from peft import LoraConfig, get_peft_model

    policy = build_model(family("Qwen3-Next"))
    assert forks_states(policy)
    assert forks_states(get_peft_model(build_model(family("LFM2")), LoraConfig(r=2, target_modules="all-linear")))
    attention = build_model(family("Qwen3"))
    assert not forks_states(attention)
    assert forks_states(PolicyAndValueModel(policy, create_value_model(policy)))
    assert not forks_states(PolicyAndValueModel(policy, create_value_model(attention)))


@pytest.mark.parametrize("name", ["Nemotron-H", "LFM2"])
def test_under_activation_checkpointing_each_forward_is_checkpointed_whole(name):
    """transformers' checkpointed layers run without a cache: the layers' checkpointing is off inside the forked
    forwards, each forward of a tree level checkpointed whole instead (its recomputation forks the parent's states
    anew), so the rows and gradients are still exact, and the layers' setting is restored."""
    model = build_model(family(name)).train()
    model.activation_checkpointing_enable({"use_reentrant": False})
    rows = _rows()
    ids, mask, keep = _batch(rows, "cpu")
    with torch.no_grad():
        own_logps, _ = _alone(model, rows, "cpu")
    logps, entropies = forked_logps_and_entropies(model, ids, mask, keep, compute_entropy=True,
                                                  temperature=TEMPERATURE, pad_token_id=model.config.pad_token_id)
    real = mask[:, -keep:].bool()
    torch.testing.assert_close(logps[real], own_logps[real], atol=ATOL, rtol=0)
    grads = _loss_grads(model, logps, entropies)
    assert model.is_activation_checkpointing
    padded = sequence_logps(model, ids, mask, keep, temperature=TEMPERATURE, compute_entropy=True)
    assert not _grads_differ(grads, _loss_grads(model, *padded[:2]), ATOL)


def test_auto_forks_where_the_forked_forwards_cost_less_than_the_padded_rows():
    """`packing="auto"` prices both paths from the rows' prefix tree (`packing.fork_cost`): eight replies to one long
    prompt go through the forked states (fewer tokens reach the model than the rows hold); rows that share nothing,
    and rows that share only their first tokens (forking would add forwards and save almost no tokens, as a
    step-wise `window:2` episode's rows do), are the padded rows, to the bit."""
    from trl_multiturn.trainers.packing import choose_plan, packed_logps_and_entropies

    model = build_model(family("LFM2"))
    forwarded = []
    model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: forwarded.append(int((args[0] != model.config.pad_token_id).sum())))
    rng = random.Random(5)

    def tokens(n):
        return [rng.randrange(100, 300) for _ in range(n)]

    prompt, opening = tokens(1000), tokens(3)
    for rows, forks in (([(prompt, tokens(4)) for _ in range(8)], True),
                        ([(tokens(n), tokens(1)) for n in (9, 12)], False),
                        ([(opening, tokens(n)) for n in (20, 24, 28, 32)], False)):
        ids, mask, keep = _batch(rows, "cpu")
        assert isinstance(choose_plan((model,), ids, mask, keep, packing="auto"), ForkPlan) == forks
        forwarded.clear()
        with torch.no_grad():
            logps, _ = packed_logps_and_entropies(model, ids, mask, keep, temperature=TEMPERATURE, packing="auto")
            assert (sum(forwarded) < sum(len(p) + len(c) for p, c in rows)) == forks
            padded = sequence_logps(model, ids, mask, keep, temperature=TEMPERATURE)[0]
        if not forks:
            assert torch.equal(logps, padded)
