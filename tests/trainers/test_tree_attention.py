"""Per-segment attention over packed prefix trees (trl_multiturn/trainers/tree_attention.py): exact against each row
forwarded alone and unpadded (log-probs, entropies, a critic's values, gradients; fp32), with the packs' dense masks
replaced by wrong ones so that only the per-segment kernel can pass; and the cost model's price of it."""

import random

import pytest
import torch
from test_packing import TEMPERATURE, batch, grouped, load, stepwise, tokens
from test_packing_windows import build, rows_around_the_window
from transformers import AutoModelForTokenClassification

from trl_multiturn.trainers import packing
from trl_multiturn.trainers.logprobs import token_logps_and_entropies
from trl_multiturn.trainers.packing import packed_logps_and_entropies, packed_values, plan_packs
from trl_multiturn.trainers.tree_attention import attention_kernel
from trl_multiturn.trainers.value_model import PolicyAndValueModel

ROWS = {
    "GRPO group": lambda: grouped(random.Random(0), prompt_len=30, group=6),
    "step-wise window:2": lambda: stepwise(random.Random(2), 2, turns=6),
    "step-wise full": lambda: stepwise(random.Random(1), "full"),
}


@pytest.fixture
def wrong_dense_masks(monkeypatch):
    """Every packed forward's dense mask replaced by one that lets each token see the whole pack: the per-segment
    kernel, which ignores it, stays exact; a forward that fell back to the dense mask would not."""
    monkeypatch.setattr(packing, "layer_masks", lambda config, forward: torch.ones_like(forward.attention_mask))


def per_row(model, rows):
    """(logps, entropies) (B, K) of each row forwarded alone, unpadded, with grad: the exact reference."""
    keep = max(len(c) for _, c in rows)
    logps, entropies = [], []
    for p, c in rows:
        ids = torch.tensor([p + c])
        logits = model(input_ids=ids, use_cache=False).logits[:, len(p) - 1:-1]
        lp, ent = token_logps_and_entropies(logits, ids[:, len(p):], TEMPERATURE, True)
        logps.append(torch.nn.functional.pad(lp[0], (0, keep - len(c))))
        entropies.append(torch.nn.functional.pad(ent[0], (0, keep - len(c))))
    return torch.stack(logps), torch.stack(entropies)


def assert_exact_per_row(model, rows):
    """Packed log-probs, entropies and the gradients of one loss over them equal the per-row unpadded forwards'."""
    ids, mask, keep = batch(rows)
    results = []
    for packed in (True, False):
        model.zero_grad()
        if packed:
            logps, entropies = packed_logps_and_entropies(model, ids, mask, keep, compute_entropy=True,
                                                          temperature=TEMPERATURE, packing="prefix")
        else:
            logps, entropies = per_row(model, rows)
        weights = torch.linspace(-1, 1, logps.numel()).view_as(logps)
        ((logps * weights).sum() + 0.1 * entropies.sum()).backward()
        results.append((logps.detach(), entropies.detach(),
                        [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (lp, ent, grads), (lp_ref, ent_ref, grads_ref) = results
    torch.testing.assert_close(lp, lp_ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(ent, ent_ref, atol=1e-4, rtol=0)
    assert len(grads) == len(grads_ref) > 0
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4 * max(1.0, b.abs().max().item()), rtol=1e-4)


@pytest.fixture(scope="module")
def model(tiny_chatml_model):
    return load(tiny_chatml_model)


@pytest.mark.parametrize("shape", list(ROWS))
def test_segments_are_exact_per_row(model, shape, wrong_dense_masks):
    assert attention_kernel(model.config._attn_implementation) == "segments"
    assert_exact_per_row(model, ROWS[shape]())


def test_the_dense_fallback_reads_the_mask(model, wrong_dense_masks, monkeypatch):
    """The control: with the dense kernel (eager's) the wrong masks give wrong log-probs: the test above can fail."""
    monkeypatch.setattr(packing, "attention_kernel", lambda implementation: "dense")
    with pytest.raises(AssertionError):
        assert_exact_per_row(model, ROWS["GRPO group"]())


def test_sliding_window_layers(wrong_dense_masks):
    """A Gemma 3-shaped model (sliding layers of 8 and full layers, grouped-query heads), rows past the window: the
    window reaches the kernel as transformers' `sliding_window` argument and cuts each segment's keys."""
    assert_exact_per_row(build("gemma3", "sdpa"), rows_around_the_window())


def test_a_critics_values(tiny_chatml_model, wrong_dense_masks):
    """PPO's critic (a token-classification model beside the policy) gets the layout too: values V(s_t) from the
    head before each kept token, and their gradients, as each row's own unpadded forward gives them."""
    torch.manual_seed(1)
    critic = AutoModelForTokenClassification.from_pretrained(tiny_chatml_model, num_labels=1,
                                                             attn_implementation="sdpa", dtype=torch.float32)
    model = PolicyAndValueModel(load(tiny_chatml_model), critic)
    rows = ROWS["step-wise window:2"]() + grouped(random.Random(5), prompt_len=20, group=3)
    ids, mask, keep = batch(rows)
    values = packed_values(model, plan_packs(ids, mask, keep, kernel="segments"))
    values.sum().backward()
    grads = [p.grad.clone() for p in critic.parameters()]
    critic.zero_grad()
    expected = torch.zeros_like(values)
    for b, (p, c) in enumerate(rows):
        expected[b, :len(c)] = critic(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1, 0]
    expected.sum().backward()
    torch.testing.assert_close(values.detach(), expected.detach(), atol=1e-4, rtol=0)
    for a, p in zip(grads, critic.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, atol=1e-4 * max(1.0, p.grad.abs().max().item()), rtol=1e-4)


def test_layout_pairs_and_chains():
    """A prompt of 10 and two replies diverging at their first token: the first row is one causal segment (13 x 14
    / 2 pairs), the second re-forwards the prompt's last token (its position predicts the first reply's token) and
    attends its 15-token path (6 x 15 pairs). A `full` history's rows are one chain: causal."""
    rng = random.Random(0)
    prompt = tokens(rng, 10)
    ids, mask, keep = batch([(prompt, [7, 8, 9]), (prompt, [10, 11, 12, 13, 14])])
    (forward,) = plan_packs(ids, mask, keep, kernel="segments").forwards
    assert [(s.start, s.n, len(s.path)) for s in forward.layout.segments] == [(0, 13, 13), (9, 6, 15)]
    assert forward.layout.pairs == 13 * 14 // 2 + 6 * 15 and not forward.layout.causal
    ids, mask, keep = batch(ROWS["step-wise full"]())
    layouts = [f.layout for f in plan_packs(ids, mask, keep, kernel="segments").forwards]
    assert [layout.causal for layout in layouts] == [True]
    assert layouts[0].segments[0].n == layouts[0].width


def test_a_sliding_layer_runs_segments_longer_than_the_window_as_tiles():
    """The same two rows under a window of 4: the first row's 13 tokens run as tiles of 4, 4, 4 and 1 queries, each
    against its own keys and the 3 above (the band), the second row's 6 as 4 and 2 against the 3 above each; no tile
    takes more than 2 x 4 - 1 keys, so the layer computes 108 pairs where the untiled segments took 13 x 13 + 6 x 9."""
    rng = random.Random(0)
    prompt = tokens(rng, 10)
    ids, mask, keep = batch([(prompt, [7, 8, 9]), (prompt, [10, 11, 12, 13, 14])])
    (forward,) = plan_packs(ids, mask, keep, kernel="segments").forwards
    layout = forward.layout
    assert [(t.start, t.n) for t in layout.tiles(4)] == [(0, 4), (4, 4), (8, 4), (12, 1), (9, 4), (13, 2)]
    assert layout.tiles(None) == layout.segments
    blocks = [layout.keys_and_mask(i, 4, "cpu") for i in range(len(layout.tiles(4)))]
    assert blocks[0] == (None, None)  # the first tile from the root is plain causal attention
    assert [tuple(m.shape) for _, m in blocks[1:]] == [(4, 7), (4, 7), (1, 4), (4, 7), (2, 5)]
    assert 4 * 5 // 2 + sum(m.numel() for _, m in blocks[1:]) == 108 < 13 * 13 + 6 * 9
    # each tile's keys are the pack positions of its row's depths from 3 above its first query to its last
    tile = layout.tiles(4)[4]
    assert blocks[4][0].tolist() == list(tile.path[tile.start - 3:])


def test_the_cost_model_prices_the_kernel():
    """A group of 8 long rows over one prompt: priced dense (L^2 per pack) the planner splits the tree into several
    packs, re-forwarding the prompt; priced per segment it keeps one pack, each prefix token forwarded once."""
    rng = random.Random(4)
    prompt = tokens(rng, 200)
    rows = [(prompt, [600 + i] + tokens(rng, 149)) for i in range(8)]  # replies differ from their first token
    ids, mask, keep = batch(rows)
    rho = 0.01
    dense = plan_packs(ids, mask, keep, rho=rho, kernel="dense")
    segments = plan_packs(ids, mask, keep, rho=rho, kernel="segments")
    assert sum(f.input_ids.shape[0] for f in dense.forwards) > 1
    assert sum(f.input_ids.shape[0] for f in segments.forwards) == 1
    assert segments.forwarded_tokens == segments.distinct_tokens + 7 < dense.forwarded_tokens
    (layout,) = [f.layout for f in segments.forwards]
    assert segments.packed_cost == pytest.approx(layout.width + rho * layout.pairs)
    assert layout.pairs == 350 * 351 // 2 + 7 * 151 * 350 < layout.width ** 2 / 2
    assert segments.packed_cost < segments.padded_cost

