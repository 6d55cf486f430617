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
from trl_multiturn.trainers.packing_states import forked_logps_and_entropies, forks_states
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


def test_which_models_fork_their_states():
    """A hybrid model forks (through PEFT too, the matrix's LoRA column); an attention-only one does not need to,
    and PPO's policy-and-critic module does not (its critic reads tree-mask packs, which refuse these layers)."""
    from peft import LoraConfig, get_peft_model

    policy = build_model(family("Qwen3-Next"))
    assert forks_states(policy)
    assert forks_states(get_peft_model(build_model(family("LFM2")), LoraConfig(r=2, target_modules="all-linear")))
    assert not forks_states(build_model(family("Qwen3")))
    assert not forks_states(PolicyAndValueModel(policy, create_value_model(policy)))


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


def test_auto_forks_where_the_rows_share_prefixes_and_pads_where_they_share_nothing():
    """`packing="auto"`: rows that share a prompt go through the forked states (fewer tokens reach the model than the
    rows hold); rows that share nothing are the padded rows, to the bit (forking would cost about as much)."""
    from trl_multiturn.trainers.packing import packed_logps_and_entropies

    model = build_model(family("LFM2"))
    forwarded = []
    model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: forwarded.append(int((args[0] != model.config.pad_token_id).sum())))
    rng = random.Random(5)
    shared = [rng.randrange(100, 300) for _ in range(12)]
    for rows, forks in (([(shared, [rng.randrange(100, 300) for _ in range(3)]) for _ in range(4)], True),
                        ([([rng.randrange(100, 300) for _ in range(n)], [rng.randrange(100, 300)]) for n in (9, 12)],
                         False)):
        ids, mask, keep = _batch(rows, "cpu")
        forwarded.clear()
        with torch.no_grad():
            logps, _ = packed_logps_and_entropies(model, ids, mask, keep, temperature=TEMPERATURE, packing="auto")
            assert (sum(forwarded) < sum(len(p) + len(c) for p, c in rows)) == forks
            padded = sequence_logps(model, ids, mask, keep, temperature=TEMPERATURE)[0]
        if not forks:
            assert torch.equal(logps, padded)
