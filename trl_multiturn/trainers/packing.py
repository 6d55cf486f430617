"""Prefix-tree packing: forward each shared token prefix of a step's rows once.

A step's rows share prefixes: a GRPO group's episodes start from one prompt, and a step-wise episode's rows repeat
its earlier turns (with `history="full"` each row extends the previous one). The padded path forwards every row whole.
Here the rows are laid out as a prefix tree (trie over token ids): each trie token is forwarded once, at the position
id it has in its rows, attending through a 4-D mask to exactly its ancestors (the tokens before it in its row). Every
token therefore computes what it computes in its own row, and per-position outputs are gathered back to each row:

    logps[b, j] = out[pred(b, d)]   with d = W - K + j - offset[b] the depth (row position) of column j of row b,
                                    pred(b, d) the packed position of the row's token d - 1

for the K kept columns of the (B, W) padded input (TRL's `logits_to_keep`), 0 where the column is padding, exactly as
the padded path (`logprobs.sequence_logps`) returns them. The logit at depth d - 1 predicts token d; a packed position
predicts one label (`shift_labels`; the LM head runs at the labelled positions only), so where two rows need
different labels from one position (the last shared token before their completions diverge), the later row
re-forwards the tokens from that position on (one token for a GRPO group's shared prompt).

Attention kernels (`tree_attention.attention_kernel`): a model loaded with SDPA runs each pack per segment (each
row's own tokens against its root path's keys: `tree_attention`), so a pack's attention costs the tree's pairs, sum
over segments of queries x path keys (`TreeLayout.pairs`); an eager model takes the 4-D mask and computes the pack's
L^2 pairs. Every forward carries both the mask and the segments (`Forward.layout`).

Rows are taken in lexicographic order of their tokens (a depth-first walk of the trie, so each row shares the most with
the row before it) and grouped into packs greedily: a row joins the current pack when forwarding its new tokens there
costs no more than forwarding it alone, under the FLOP model

    cost = tokens + rho * pairs,    rho = 4 d / (2 (2 d^2 + 2 d d_kv + 3 d d_ff))

(per token and layer: the linear layers, 2 (2 d^2 + 2 d d_kv + 3 d d_ff) FLOPs; per query-key pair: 4 d:
`attention_cost_ratio`; the LM head runs on the scored tokens in both paths), with the pairs of the kernel the model
runs (`forward_cost`: k L^2 for a dense forward of k packs of L, the segments' pairs per segment; padded rows W^2 each,
W (W + 1) / 2 under SDPA where no row is padded, as SDPA then runs them causal), and the pack
stays within the token budget, `batch_size` x W: the tokens of one padded chunk of TRL's forwards, so that no forward
holds more tokens than the padded path's. Packs are batched into forwards of (k, L) with k L <= budget. Where the
planned forwards cost more than the padded rows (little shared, long packs), `packing="auto"` takes the padded path.

Micro-batching: every forward of a step goes through `packed_logps_and_entropies` (the trainers' override of TRL's
`_get_per_token_logps_and_entropies`). For the old and reference log-probs (no grad) that is the whole generation
batch with `batch_size=per_device_train_batch_size`: packs may then hold a group's rows across TRL's chunks, each
forward within a chunk's tokens. For the loss it is one micro-batch's rows (gradient accumulation unchanged): packs
cover whole rows of that micro-batch only, so rows share prefixes in the loss where a micro-batch holds a group's (or
an episode's) rows together. One `plan_packs` of a batch serves every forward of those rows: the trainers plan
through a `RowsPlanner`, which keeps the plan of the rows it planned last.

PPO: the critic (a token-classification model beside the policy, `value_model.PolicyAndValueModel`) reads the same
packs, its value V(s_t) gathered from the position before t as a log-prob is: `packed_values` for its no-grad passes
(the rows', with the old log-probs' budget; step-wise, the steps `steps_per_batch` leaves out, all in one plan) and
`packed_policy_and_values` for the loss, one plan per micro-batch serving one forward of each model per pack. Policy
and critic take one mask form, so `choose_plan` holds both to the rules below and to one attention implementation
(hybrid ones: one plan of forked forwards, below).

Sliding-window layers: a token of a sliding layer attends the keys less than `window` positions before it in its row
(transformers' convention: the window holds the token itself and the `window - 1` before it), and in a pack a token's
depth in the tree is its position id, so that layer's mask is the tree mask less the ancestors `window` or more
positions above (`window_mask`). The families in `WINDOWED_FAMILIES` take one mask per layer type (a dict keyed by
`config.layer_types`' names), and `model_inputs` gives them the tree mask for `full_attention` layers and the windowed
one for `sliding_attention` layers: exact with rows longer than the window.

Several processes: each rank packs its own rows (the rows it played: TRL's `RepeatSampler` lays a task's
`num_generations` rows side by side and accelerate hands each rank a contiguous slice of them, so a group is whole on
one rank when `per_device_train_batch_size` x `steps_per_generation` is a multiple of `num_generations`, and a
step-wise episode's rows are always on the rank that played it; a group split between ranks is packed in its share on
each). Every rank must run the same number of forwards (DDP syncs buffers and FSDP gathers parameters at each), so
`choose_plan` hands its rank's plan to an agreement (`forwards.Forwards.agree`): packed where every rank's rows pack,
else every rank pads its rows, and a rank with fewer forwards than the busiest runs filler forwards
(`with_filler_forwards`: one pad token each, no row reads them), padding forwards, not rows; a hybrid model's forked
forwards (below) are agreed the same way. Planning that fails on
one rank only (a "prefix" refusal of its rows alone, longer than a sliding window where the others' are not) fails on
every rank: the failure travels in the same agreement, and each rank raises one error naming the failing rank and its
reason, where raising it on that rank alone would leave the others waiting in the collective. Rows are not moved
between ranks to balance their tokens: on two ranks the costliest does 1.10-1.19x the mean rank's work on the median
step, and placing whole groups by cost would make it 1.01-1.13x cheaper (benchmarks/results/packing_ranks.md); why
that is not built, docs/limits.md.

Needs an attention implementation that honours a custom 4-D mask: SDPA (boolean, True = attend; run per segment, the
mask the fallback of a layer the segments cannot serve) or eager (additive float), and every layer that mixes tokens to
be such an attention layer. Refused by name (`packing="prefix"`), or
padded with a log line (`packing="auto"`), never silently wrong: other attention implementations (flash attention,
flex attention, paged kernels), sliding-window layers shorter than the rows in a family outside `WINDOWED_FAMILIES`
(its one 4-D mask carries no window, so they would see the whole row), and any layer that runs over the sequence as a
stream (`sequence_mixer_refusal`: the linear attention (Gated DeltaNet) of Qwen3.5 and Qwen3-Next, LFM2's short
convolutions, the Mamba2 layers of Nemotron-H, Falcon-H1 and GraniteMoeHybrid), where a packed row would read the
state its pack's earlier rows left. Such a model, where its transformers cache holds every such layer's state
(`packing_states.forks_states`: the six families above), shares its rows' prefixes another way in every log-prob
forward: each shared prefix forwarded once and each branch continued from the prefix's layer states
(`packing_states.forked_logps_and_entropies`), exact, gradients included: 3.8-7.5x faster than its padded rows on a
GRPO group's rows, 2.4-4.5x on a step-wise episode's, on CPU (benchmarks/results/packing_states.md); `packing="auto"`
forks where the forked forwards, priced from the rows' prefix tree before any runs (`fork_cost`: their FLOPs and a
fixed price per forward), cost less than the padded rows, and pads the others. On several processes its forked
forwards are planned before they run (`packing_states.plan_forks`) and agreed as packs are: forked where every rank's
rows fork, a rank with fewer forked forwards running filler forwards (a root of two pad tokens through the whole
model), else every rank pads. PPO forks where its policy and its critic both fork (`choose_plan` over the two: its
critic's value passes and its loss's one forward of both, `packed_values` and `packed_policy_and_values` by a
`ForkPlan`, each model continued from its own layer states; "auto" prices the sum of both models' forwards); where one
forks and the other reads tree-mask packs one plan cannot serve them, and "prefix" refuses them (`fork_choice`), "auto"
pads. The support of each model family is measured, not assumed: docs/models.md, generated by
scripts/model_matrix.py from `trl_multiturn/model_families.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..model_layers import model_name, streaming_layers, text_config, unwrap
from .logprobs import sequence_logps, token_logps_and_entropies
from .packing_states import ForkPlan, forked_forwards, forks_states, padded_rows, plan_forks, run_forks
from .tree_attention import TREE_LAYOUT, TreeLayout, attention_kernel
from .value_model import PolicyAndValueModel

logger = logging.getLogger(__name__)

PACKING_MODES = ("auto", "prefix", "padded")
"""`packing` values: "prefix" packs (refusing a model that cannot take it), "padded" forwards the rows as they are,
"auto" packs where the model can take it and the cost model says it is cheaper, else pads."""

MASKABLE_ATTENTION = ("sdpa", "eager")
"""Attention implementations whose transformers kernels take a custom 4-D mask as it is."""

WINDOWED_FAMILIES = ("gemma3_text", "gemma4_text", "gpt_oss", "olmo3")
"""`model_type`s (of the text config) whose models take a dict of masks keyed by layer type, packed exactly with
sliding-window layers narrower than the rows (tests/trainers/test_packing_windows.py; OLMo 3 by the model matrix,
tests/trainers/test_model_matrix.py)."""

IGNORE = -100

FORWARD_TOKENS = (350.0, 2000.0)
"""`fork_cost`'s fixed price of one forward, in tokens, with one torch thread and with more: what a forward costs
beyond its FLOPs (Python and kernel launches, each streaming layer's scan over its chunks, the forked states'
copies, and with threads their synchronisation on small tensors), measured with the Qwen3.5-shaped model on this
machine's CPU by benchmarks/packing_fork_cost.py (benchmarks/results/packing_states.md: one thread fitted, two
threads chosen where `auto` took the faster path on every measured shape; more than two not measured)."""


@dataclass(frozen=True)
class Forward:
    """One forward of packs: (k, L) tensors; `attention_mask` is (k, 1, L, L), True where a query may attend a key
    (converted to the model's additive form by `model_inputs` for eager attention); `layout` the same tree as
    segments, for the per-segment kernel (`tree_attention`)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    shift_labels: torch.Tensor
    layout: TreeLayout


@dataclass(frozen=True)
class PackPlan:
    """The packed layout of B rows: the forwards to run and where each row's kept columns come from.

    `index` (B, K) points into the concatenation of every forward's flattened (k * L) outputs, `valid` (B, K) is False
    where TRL's padded output is 0 (padding, or a column before the kept region)."""

    forwards: list[Forward]
    index: torch.Tensor
    valid: torch.Tensor
    forwarded_tokens: int
    """Real tokens in the packs (what the packed forwards compute, padding of packs to a forward's length apart)."""
    distinct_tokens: int
    """Nodes of the rows' prefix tree: the fewest tokens any prefix sharing can forward (the limit)."""
    padded_tokens: int
    """B x W: what the padded path forwards."""
    packed_cost: float
    padded_cost: float

    @staticmethod
    def filler(pad_token_id: int) -> Forward:
        """A filler forward (`with_filler_forwards`): one pad token at position 0, attending to itself, predicting
        no label."""
        return Forward(torch.full((1, 1), pad_token_id, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long),
                       torch.ones(1, 1, 1, 1, dtype=torch.bool), torch.full((1, 1), IGNORE, dtype=torch.long),
                       TreeLayout.from_packs(1, [[([0], 0)]]))

    def unpack(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """(B, K) from per-position outputs, one (k, L) tensor per forward (log-probs, entropies, a critic's values):
        the output at each kept column's predicting position, 0 where not `valid`."""
        flat = torch.cat([out.reshape(-1) for out in outputs])
        index = self.index.to(flat.device)
        return flat[index].masked_fill(~self.valid.to(flat.device), 0)


def check_packing(packing: str) -> str:
    """`packing` as given, or a ValueError naming the choices."""
    if packing not in PACKING_MODES:
        raise ValueError(f"packing={packing!r}: choose one of {PACKING_MODES}")
    return packing


def packing_refusal(model, max_length: int) -> str | None:
    """Why `model` cannot run packed rows up to `max_length` tokens long, or None when it can.

    Refused: an attention implementation that ignores or rebuilds a custom 4-D mask (anything but SDPA and eager),
    a layer that runs over the sequence as a stream (`sequence_mixer_refusal`), and sliding-window attention layers
    narrower than the rows outside `WINDOWED_FAMILIES` (their one 4-D mask carries no window)."""
    config = text_config(model)
    if config is None:
        return (f"{type(model).__name__} has no transformers config to tell its attention implementation: use "
                "packing='padded'")
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in MASKABLE_ATTENTION:
        return (f"{model_name(model)}: attn_implementation={implementation!r} cannot take the prefix-tree 4-D "
                f"attention mask (it takes {' or '.join(MASKABLE_ATTENTION)}): load the model with "
                "attn_implementation='sdpa', or use packing='padded'")
    mixer = sequence_mixer_refusal(model)
    if mixer:
        return mixer
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    sliding = any(kind == "sliding_attention" for kind in layer_types) if layer_types else (
        window is not None and getattr(config, "use_sliding_window", True))
    family = getattr(config, "model_type", None)
    if sliding and window is not None and max_length > window and family not in WINDOWED_FAMILIES:
        return (f"{model_name(model)}: its sliding_attention layers (sliding_window={window}) are shorter than the "
                f"longest row ({max_length} tokens) and its packed mask carries no window: use packing='padded'")
    return None


def sequence_mixer_refusal(model) -> str | None:
    """Why `model`'s layers cannot run packed rows whatever their length, or None: one line naming the model, the
    layers and the setting that works. A packed forward lays several rows out in one sequence and separates them by
    the attention mask alone; a layer that runs over the sequence as a stream (`model_layers.streaming_layers`:
    Gated DeltaNet, Mamba2, a short convolution, or a layer type the library does not know) would carry the state of
    the rows packed before a row into it."""
    streaming = streaming_layers(model)
    if streaming is None:
        return None
    return (f"{model_name(model)} has {streaming}, which run over the packed rows as one stream (a row would read the "
            "state of the rows packed before it): use packing='padded'")


def check_model_packing(model, packing: str) -> None:
    """At a trainer's start: refuse `packing="prefix"` for a model that cannot run packed rows at any length (its
    attention implementation, or its layers: `packing_refusal` for rows of no length; sliding windows are judged per
    batch; a model that forks its layer states, `packing_states.forks_states`, packs; PPO's policy and critic where
    one forks and the other does not: `fork_choice`), and say in the log that `packing="auto"` will pad its rows."""
    if check_packing(packing) == "padded":
        return
    forking, refusal = fork_choice((model,))
    refusal = None if forking else refusal or packing_refusal(model, 0)
    if refusal and packing == "prefix":
        raise ValueError(f"packing='prefix': {refusal}")
    if refusal:
        _log_padding(refusal)


_LOGGED_PADDING: set[str] = set()
"""The reasons `packing="auto"` padded for, logged once each per process: each refusal's text up to its first
colon (the model and the reason, without a batch's row length)."""


def _log_padding(refusal: str) -> None:
    key = refusal.partition(":")[0]
    if key not in _LOGGED_PADDING:
        _LOGGED_PADDING.add(key)
        logger.warning("packing='auto' pads the rows: %s", refusal)


def window_mask(mask: torch.Tensor, position_ids: torch.Tensor, window: int) -> torch.Tensor:
    """The tree mask of a sliding-window layer: `mask` (k, 1, L, L) kept where the key is less than `window` positions
    above the query in its row,

        sliding[q, k] = mask[q, k] and pos[q] - pos[k] < window

    with `position_ids` (k, L) the depth of each packed token (transformers' `sliding_window_overlay`: a window of W
    holds the token itself and the W - 1 before it). A query's keys are its ancestors: the distance is in its row."""
    distance = position_ids[:, None, :, None] - position_ids[:, None, None, :]
    return mask & (distance < window)


def layer_masks(config, forward: Forward) -> torch.Tensor | dict[str, torch.Tensor]:
    """The boolean mask(s) of one packed forward: the tree mask, or for a family in `WINDOWED_FAMILIES`, one per
    layer type of `config.layer_types` (`window_mask` for "sliding_attention", the tree mask for the others)."""
    if getattr(config, "model_type", None) not in WINDOWED_FAMILIES:
        return forward.attention_mask
    sliding = window_mask(forward.attention_mask, forward.position_ids, config.sliding_window)
    return {kind: sliding if kind == "sliding_attention" else forward.attention_mask
            for kind in set(config.layer_types)}


def with_filler_forwards(plan: PackPlan | ForkPlan, forwards: int, pad_token_id: int = 0) -> PackPlan | ForkPlan:
    """`plan` with filler forwards appended up to `forwards` forwards in all, each the narrowest forward of its kind
    through the whole model (`plan.filler`: a packed plan's one pad token attending to itself, a forked plan's root of
    two pad tokens). No row reads their outputs, so the rows' outputs are those of `plan`; their outputs still enter
    the concatenation the rows are gathered from (`PackPlan.unpack`, `packing_states.run_forks`), so a loss's
    backward runs through every forward (as many on each rank, each touching the parameters a real one touches) and
    gives them zero gradient."""
    missing = forwards - len(plan.forwards)
    if missing < 0:
        raise ValueError(f"a plan of {len(plan.forwards)} forwards cannot be filled up to {forwards}")
    return dataclasses.replace(plan, forwards=[*plan.forwards, *[plan.filler(pad_token_id)] * missing])


def plan_packs(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
               batch_size: int | None = None, *, pad_token_id: int = 0, rho: float = 0.0,
               kernel: str = "dense") -> PackPlan:
    """The prefix-tree packing of the rows of a padded batch, in TRL's layout: `input_ids` and `attention_mask` (B, W),
    each row's real tokens one contiguous run (left-padded prompt, right-padded completion), the last
    `logits_to_keep` (K) columns scored. `batch_size` (TRL's chunk size, default B) sets the token budget of a forward,
    `batch_size` x W; `rho` is the cost model's attention weight (`attention_cost_ratio`), `kernel` the attention
    kernel it prices (`tree_attention.attention_kernel`: "dense" or "segments")."""
    B, W = input_ids.shape
    K = logits_to_keep
    budget = (batch_size or B) * W
    rows, offsets, scored_from = padded_rows(input_ids, attention_mask, K)
    builder = _PackBuilder(budget, rho, kernel)
    maps = [None] * B
    order = sorted(range(B), key=lambda b: rows[b])
    prev = None
    for b in order:
        if not rows[b]:
            maps[b] = []
            continue
        maps[b] = builder.add(rows[b], scored_from[b], None if prev is None else (rows[prev], maps[prev]))
        prev = b
    forwards, base = builder.finish(pad_token_id)
    index = torch.zeros(B, K, dtype=torch.long)
    valid = torch.zeros(B, K, dtype=torch.bool)
    for b in range(B):
        n = len(rows[b])
        for j in range(K):
            depth = W - K + j - offsets[b]
            if 1 <= depth < n:
                pack, position = maps[b][depth - 1]
                index[b, j] = base[pack] + position
                valid[b, j] = True
    # SDPA runs rows without padding as causal attention (`is_causal`), with padding under a dense mask
    causal_rows = kernel == "segments" and bool(attention_mask.bool().all())
    padded_cost = B * (W + rho * (W * (W + 1) / 2 if causal_rows else W * W))
    packed_cost = sum(forward_cost(f, rho, kernel) for f in forwards)
    return PackPlan(forwards, index, valid, builder.forwarded, _trie_size(rows, order), B * W, packed_cost,
                    padded_cost)


def forward_cost(forward: Forward, rho: float, kernel: str) -> float:
    """The cost model's price of one packed forward of (k, L) tokens: k L + rho x the query-key pairs its attention
    kernel computes, k L^2 with the dense mask, `TreeLayout.pairs` per segment (sum over segments of queries x
    root-path keys, half the square for a causal segment)."""
    k, width = forward.input_ids.shape
    return k * width + rho * (forward.layout.pairs if kernel == "segments" else k * width * width)


def attention_cost_ratio(model) -> float:
    """rho of the cost model: FLOPs of one masked query-key pair over those of one token's linear layers, over the
    layers l,

        rho = sum_l 4 d / sum_l 2 (2 d^2 + 2 d d_kv,l + 3 d d_ff,l)

    with each layer's own sizes where the config varies them by layer (`per_layer_config`, as Gemma 4's head sizes);
    the LM head runs on the scored tokens only, in both paths alike."""
    config = text_config(model)
    return sum(4 * layer.hidden_size for layer in _layer_configs(config)) / _linear_flops(config)


def _layer_configs(config) -> list:
    return list(config.per_layer_config) if getattr(config, "is_heterogeneous", False) else [config]


def _linear_flops(config) -> float:
    """FLOPs of one token through the linear layers of the layers l of `config`, sum_l 2 (2 d^2 + 2 d d_kv,l +
    3 d d_ff,l) (`attention_cost_ratio`)."""
    linear = 0.0
    for layer in _layer_configs(config):
        d = layer.hidden_size
        heads = layer.num_attention_heads
        head_dim = getattr(layer, "head_dim", None) or d // heads
        d_kv = (getattr(layer, "num_key_value_heads", None) or heads) * head_dim
        d_ff = getattr(layer, "intermediate_size", 4 * d)
        linear += 2 * (2 * d * d + 2 * d * d_kv + 3 * d * d_ff)
    return linear


def model_inputs(model, forward: Forward) -> dict:
    """The keyword arguments of `model` for one packed forward: ids, position ids and the 4-D mask(s) of
    `layer_masks` in the form the model's attention implementation takes (boolean for SDPA, additive for eager)."""
    device = _device(model)
    config = text_config(model)
    dtype = getattr(model, "dtype", torch.float32)

    def form(mask: torch.Tensor) -> torch.Tensor:
        mask = mask.to(device)
        if config._attn_implementation != "eager":
            return mask
        return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)

    masks = layer_masks(config, forward)
    masks = {kind: form(m) for kind, m in masks.items()} if isinstance(masks, dict) else form(masks)
    inputs = {"input_ids": forward.input_ids.to(device), "position_ids": forward.position_ids.to(device),
              "attention_mask": masks}
    if attention_kernel(config._attn_implementation) == "segments":
        inputs[TREE_LAYOUT] = forward.layout
    return inputs


class RowsPlanner:
    """`plan_packs` that remembers the rows it planned last: a step forwards one batch's rows several times (the old
    log-probs, the reference's, PPO's critic values), and one plan serves them all. The rows are known by identity
    (the same tensors, not written since: their `_version`) with every other input of the plan."""

    def __init__(self):
        self._last = None

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                 batch_size: int | None = None, *, pad_token_id: int = 0, rho: float = 0.0,
                 kernel: str = "dense") -> PackPlan:
        key = (input_ids._version, attention_mask._version, logits_to_keep, batch_size, pad_token_id, rho, kernel)
        if self._last is not None:
            ids, mask, last_key, plan = self._last
            if ids is input_ids and mask is attention_mask and last_key == key:
                return plan
        plan = plan_packs(input_ids, attention_mask, logits_to_keep, batch_size, pad_token_id=pad_token_id, rho=rho,
                          kernel=kernel)
        self._last = (input_ids, attention_mask, key, plan)
        return plan


def choose_plan(models, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                batch_size: int | None = None, *, packing: str, planner=plan_packs,
                agree=None) -> PackPlan | ForkPlan | None:
    """The plan by which `models` run these rows (`planner`: `plan_packs`, or a `RowsPlanner`), or None for the
    padded rows: None for `packing="padded"`, and for "auto" where a model cannot take the packed mask
    (`packing_refusal`) or the plan costs more than the rows; "prefix" refuses such a model by name. Models whose
    layers carry a state along the sequence (`packing_states.forks_states`, every one of them) take a
    `packing_states.ForkPlan` instead, made once and, under "auto", priced against the padded rows (`fork_cost`,
    summed over the models): taken where it costs less; models of which some fork and some do not are refused
    (`fork_choice`). The models (a
    policy, and PPO's critic beside it) are forwarded with the first one's mask form, so they must share an attention
    implementation, and all or none be in `WINDOWED_FAMILIES` (a dict of masks per layer type). On several
    processes `agree` (`forwards.Forwards.agree`) turns this rank's choice into the one every rank runs; an error
    while planning (a "prefix" refusal of this rank's rows, longer than a sliding window where another rank's are not)
    goes to `agree` too, which raises it on every rank rather than leave the others waiting in its collective."""
    check_packing(packing)
    if packing == "padded":
        return None
    return _agreed(lambda: _own_plan(models, input_ids, attention_mask, logits_to_keep, batch_size, packing, planner),
                   agree)


def _agreed(own, agree):
    """The plan every process runs: `own()` (this process's plan of its rows, or None for its rows padded) as it is
    on one process (`agree` None), else `agree`'s of it (`forwards.Forwards.agree`), which takes an error `own()`
    raised too and raises it on every process rather than leave the others waiting in its collective."""
    if agree is None:
        return own()
    try:
        plan = own()
    except Exception as error:  # noqa: BLE001 - every rank raises it, in `agree`
        return agree(None, error)
    return agree(plan)


def _own_plan(models, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
              batch_size: int | None, packing: str, planner) -> PackPlan | ForkPlan | None:
    """`choose_plan` of this process's rows alone ("auto" or "prefix")."""
    forking, refusal = fork_choice(models)
    if forking:
        plan = plan_forks(input_ids, attention_mask, logits_to_keep, batch_size, pad_token_id=_pad_id(models[0]))
        if packing == "prefix":
            return plan
        padded, forked = (sum(prices) for prices in zip(*(fork_cost(m, plan, attention_mask, batch_size)
                                                           for m in models), strict=True))
        return plan if forked < padded else None
    longest = int(attention_mask.sum(1).max())
    refusal = refusal or next((r for r in (packing_refusal(m, longest) for m in models) if r), None)
    implementations = [getattr(text_config(m), "_attn_implementation", None) for m in models]
    if refusal is None and len(set(implementations)) > 1:
        refusal = (f"the models' attn_implementation differ ({', '.join(map(repr, implementations))}) and one packed "
                   "mask serves them all: load them with the same one, or use packing='padded'")
    families = [getattr(text_config(m), "model_type", None) for m in models]
    if refusal is None and len({family in WINDOWED_FAMILIES for family in families}) > 1:
        refusal = (f"of the models' families ({', '.join(map(repr, families))}) some take a mask per layer type and "
                   "some one mask, and one packed mask form serves them all: use packing='padded'")
    if refusal:
        if packing == "prefix":
            raise ValueError(f"packing='prefix': {refusal}")
        _log_padding(refusal)
        return None
    plan = planner(input_ids, attention_mask, logits_to_keep, batch_size, pad_token_id=_pad_id(models[0]),
                   rho=attention_cost_ratio(models[0]), kernel=attention_kernel(implementations[0]))
    return plan if packing == "prefix" or plan.packed_cost < plan.padded_cost else None


def fork_choice(models) -> tuple[bool, str | None]:
    """(whether every model forks its layer states, `packing_states.forks_states`; the refusal where some do and some
    do not). PPO's policy-and-critic module counts as its two models: one plan serves both (`choose_plan`), and a
    plan of forked forwards cannot serve a model that reads tree-mask packs, nor the reverse."""
    parts = [part for model in models for part in _policy_and_critic(model)]
    forking = [forks_states(part) for part in parts]
    if all(forking) or not any(forking):
        return all(forking), None
    forks = ", ".join(model_name(part) for part, fork in zip(parts, forking, strict=True) if fork)
    others = ", ".join(model_name(part) for part, fork in zip(parts, forking, strict=True) if not fork)
    return False, (f"{forks} shares prefixes by forking its layer states and {others} does not, and one plan serves "
                   "the policy and its critic: pass `value_model=` a critic with the policy's kind of layers (its "
                   "own transformers model, whose cache holds their states), or use packing='padded'")


def _policy_and_critic(model) -> tuple:
    """A `value_model.PolicyAndValueModel`'s policy and critic; any other model alone."""
    unwrapped = unwrap(model)
    return (unwrapped.policy, unwrapped.critic) if isinstance(unwrapped, PolicyAndValueModel) else (model,)


def packed_logps_and_entropies(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                               batch_size: int | None = None, compute_entropy: bool = False, *, temperature: float,
                               packing: str = "auto", planner=plan_packs, agree=None, autocast=None, padded=None):
    """(logps (B, K), entropies (B, K) or None): what the padded path `logprobs.sequence_logps(model, input_ids,
    attention_mask, logits_to_keep, temperature=temperature, batch_size=..., compute_entropy=...)` returns, by
    prefix-tree packing.

    The padded path runs where `choose_plan` chooses no plan (`padded`, called as `padded(model, input_ids,
    attention_mask, logits_to_keep, batch_size, compute_entropy=...)`, replaces it). `planner` plans the rows (a
    `RowsPlanner` shares one plan among the forwards of one batch's rows); `agree` makes the ranks' plans one
    (`choose_plan`; None on one process); `autocast` is the accelerator's, around each forward. A model whose layers
    carry a state along the sequence, and whose cache holds it (`packing_states.forks_states`), shares its rows'
    prefixes by continuing each branch from the prefix's layer states instead of a plan's packs
    (`packing_states.ForkPlan`, `run_forks`); "auto" forks where the forked forwards cost less than the padded rows
    (`fork_cost`). On several processes the forked plans go through `agree` as the packed ones do: forked where every
    rank's rows fork, a rank with fewer forked forwards running filler forwards up to the busiest rank's
    (`with_filler_forwards`)."""
    plan = choose_plan((model,), input_ids, attention_mask, logits_to_keep, batch_size, packing=packing,
                       planner=planner, agree=agree)
    if plan is not None:
        with autocast() if autocast is not None else nullcontext():
            run = run_forks if isinstance(plan, ForkPlan) else _run_packed
            logps, entropies, _ = run(model, plan, compute_entropy, temperature=temperature)
        return logps, entropies
    if padded is None:
        return sequence_logps(model, input_ids, attention_mask, logits_to_keep, temperature=temperature,
                              batch_size=batch_size, compute_entropy=compute_entropy, autocast=autocast)[:2]
    return padded(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy=compute_entropy)[:2]


def fork_cost(model, plan: ForkPlan, attention_mask: torch.Tensor, batch_size: int | None = None
              ) -> tuple[float, float]:
    """(padded, forked): the prices of `model`'s forward of `plan`'s rows (`attention_mask` their padded mask) as
    padded rows and by forked layer states, in tokens (`fork_work`'s work plus `FORWARD_TOKENS` per forward, its
    one-thread price where torch runs one)."""
    per_forward = FORWARD_TOKENS[0] if torch.get_num_threads() == 1 else FORWARD_TOKENS[1]
    return tuple(work + per_forward * forwards
                 for forwards, work in fork_work(model, plan, attention_mask, batch_size))


def fork_work(model, plan: ForkPlan, attention_mask: torch.Tensor, batch_size: int | None = None
              ) -> tuple[tuple[int, float], tuple[int, float]]:
    """Per path, padded rows (`logprobs.sequence_logps`: a forward of (n, W) per `batch_size` rows) and forked layer
    states (`packing_states.forked_forwards` of `plan`: forwards of n nodes padded to q tokens, reading kv keys), its
    number of forwards and its work in tokens' worth of FLOPs, summed over its forwards,

        work = n q + rho pairs + lam logits,   lam = 2 d V / sum_l 2 (2 d^2 + 2 d d_kv,l + 3 d d_ff,l)

    pairs n q kv (n W (W + 1) / 2 for padded rows without padding, which SDPA runs causal), rho
    `attention_cost_ratio` (which counts every layer as attention: an upper bound on a hybrid model), logits those
    the model's head computes, V wide (the vocabulary; a critic's one value: `_head_width`): B K for the padded rows,
    and for the forked ones the scored real tokens (each shared one computed once)."""
    B, W = attention_mask.shape
    logits_to_keep = plan.logits_to_keep
    rows = batch_size or B
    causal = bool(attention_mask.bool().all())
    padded = [(min(rows, B - start), W, (W + 1) / 2 if causal else W) for start in range(0, B, rows)]
    forked = forked_forwards(plan)
    rho = attention_cost_ratio(model)
    config = text_config(model)
    lam = 2 * config.hidden_size * _head_width(model) / _linear_flops(config)
    logits = (B * logits_to_keep, int(attention_mask[:, -logits_to_keep:].sum()) if logits_to_keep else 0)
    return tuple((len(forwards), sum(n * q + rho * n * q * kv for n, q, kv in forwards) + lam * scored)
                 for forwards, scored in zip((padded, forked), logits, strict=True))


def _head_width(model) -> int:
    """The outputs of `model`'s head per token: a language model's vocabulary, a critic's (token classification)
    labels."""
    head = unwrap(model).get_output_embeddings()
    return head.out_features if head is not None else text_config(model).num_labels


def packed_values(model, plan: PackPlan | ForkPlan) -> torch.Tensor:
    """(B, K) values V(s_t) of each kept token t from a policy-and-critic module (`value_model.PolicyAndValueModel`:
    `model(..., output="values")` is the critic's head at every position): the head at the packed position of the
    token before t, 0 where not `plan.valid`; by a `ForkPlan`, the critic continued from its layer states
    (`packing_states.run_forks`). Equal, on the valid columns, to `value_model.token_values(critic, input_ids,
    attention_mask, logits_to_keep)` of the padded rows."""
    if isinstance(plan, ForkPlan):
        return run_forks(model, plan, output="values")[2]
    return plan.unpack([model(**model_inputs(model, forward), output="values") for forward in plan.forwards])


def packed_policy_and_values(model, plan: PackPlan | ForkPlan, *, temperature: float):
    """(logps, entropies, values), each (B, K): PPO's loss forward by `plan`, one forward of the policy and one of the
    critic per packed (or forked) forward (`model(..., output="both")` of a `value_model.PolicyAndValueModel`): the
    log-probs and entropies `packed_logps_and_entropies` returns and the values `packed_values` returns."""
    if isinstance(plan, ForkPlan):
        return run_forks(model, plan, True, temperature=temperature, output="both")
    return _run_packed(model, plan, True, temperature=temperature, with_values=True)


def _run_packed(model, plan: PackPlan, compute_entropy: bool, *, temperature: float, with_values: bool = False):
    """Each forward of `plan`, its logits computed only at the positions that predict a label (`logits_to_keep` as
    indices), scored by `logprobs.token_logps_and_entropies` as the padded path scores them; with `with_values`, the
    critic's values of the same forward (`output="both"`). Returns (logps, entropies or None, values or None)."""
    logps, entropies, values = [], [], []
    for forward in plan.forwards:
        labels = forward.shift_labels.to(_device(model))
        positions = (labels != IGNORE).any(dim=0).nonzero().flatten()
        inputs = {**model_inputs(model, forward), "logits_to_keep": positions, "use_cache": False}
        if with_values:
            out, forward_values = model(**inputs, output="both")
            values.append(forward_values)
        else:
            out = model(**inputs)
        lp, ent = token_logps_and_entropies(out.logits, labels[:, positions].clamp(min=0), temperature,
                                            compute_entropy)
        logps.append(lp.new_zeros(labels.shape).index_copy(1, positions, lp))
        if compute_entropy:
            entropies.append(ent.new_zeros(labels.shape).index_copy(1, positions, ent))
    return (plan.unpack(logps), plan.unpack(entropies) if compute_entropy else None,
            plan.unpack(values) if with_values else None)


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _pad_id(model) -> int:
    pad = getattr(text_config(model), "pad_token_id", None)
    return 0 if pad is None else int(pad)


def _trie_size(rows: list[list[int]], order: list[int]) -> int:
    """Nodes of the rows' prefix tree: in lexicographic order each row adds its tokens past its longest common prefix
    with the row before it."""
    total, prev = 0, []
    for b in order:
        total += len(rows[b]) - _common_prefix(prev, rows[b])
        prev = rows[b]
    return total


def _common_prefix(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


class _PackBuilder:
    """Packs built row by row in lexicographic order (`add`), then laid out as forwards (`finish`)."""

    def __init__(self, budget: int, rho: float, kernel: str):
        self.budget, self.rho, self.kernel = budget, rho, kernel
        self.packs: list[dict] = []
        self.forwarded = 0

    def _joins(self, length: int, new: int, row: int) -> bool:
        """Whether a row of `row` tokens, `new` of them its own, costs no more added to a pack of `length` tokens
        than alone: with the dense mask the pack's L + rho L^2 grows; per segment, its queries see the row's path
        (new + rho new row) against a causal row alone (row + rho row (row + 1) / 2)."""
        if self.kernel == "segments":
            return new + self.rho * new * row <= row + self.rho * row * (row + 1) / 2

        def cost(tokens: int) -> float:
            return tokens + self.rho * tokens * tokens

        return cost(length + new) - cost(length) <= cost(row)

    def _new_pack(self) -> None:
        self.packs.append({"ids": [], "pos": [], "labels": [], "segments": []})

    def add(self, row: list[int], scored_from: int, prev) -> list[tuple[int, int]]:
        """Place `row` (its tokens from depth `scored_from` scored) after `prev` (the previous row and its map, or
        None); return the row's map: per depth, (pack, position)."""
        start, shared = 0, []
        if prev is not None:
            prev_row, prev_map = prev
            pack = self.packs[-1]
            common = _common_prefix(prev_row, row)
            shared = prev_map[:common]
            start = common
            # the first scored token whose predicting position already predicts another label: re-forward from there
            for depth in range(max(scored_from, 1), min(common, len(row) - 1) + 1):
                label = pack["labels"][shared[depth - 1][1]]
                if label not in (IGNORE, row[depth]):
                    start = depth - 1
                    break
            new = len(row) - start
            length = len(pack["ids"])
            if length + new > self.budget or not self._joins(length, new, len(row)):
                start, shared = 0, []
        if start == 0:
            self._new_pack()
        pack_index, pack = len(self.packs) - 1, self.packs[-1]
        row_map = list(shared[:start])
        first = len(pack["ids"])
        row_map += [(pack_index, first + i) for i in range(len(row) - start)]
        pack["ids"] += row[start:]
        pack["pos"] += range(start, len(row))
        pack["labels"] += [IGNORE] * (len(row) - start)
        pack["segments"].append(([p for _, p in row_map], start))
        for depth in range(max(scored_from, 1), len(row)):
            pack["labels"][row_map[depth - 1][1]] = row[depth]
        self.forwarded += len(row) - start
        return row_map

    def finish(self, pad_token_id: int) -> tuple[list[Forward], list[int]]:
        """The packs as forwards of (k, L) with k L <= budget (longest first), and each pack's offset in the
        concatenation of the forwards' flattened outputs."""
        order = sorted(range(len(self.packs)), key=lambda i: -len(self.packs[i]["ids"]))
        groups, base = [], [0] * len(self.packs)
        for i in order:
            length = len(self.packs[i]["ids"])
            if groups and (len(groups[-1]) + 1) * groups[-1][0][1] <= self.budget:
                groups[-1].append((i, length))
            else:
                groups.append([(i, length)])
        forwards, offset = [], 0
        for group in groups:
            width = group[0][1]
            k = len(group)
            ids = torch.full((k, width), pad_token_id, dtype=torch.long)
            pos = torch.zeros(k, width, dtype=torch.long)
            labels = torch.full((k, width), IGNORE, dtype=torch.long)
            mask = torch.eye(width, dtype=torch.bool).repeat(k, 1, 1, 1)
            for slot, (i, length) in enumerate(group):
                pack = self.packs[i]
                ids[slot, :length] = torch.tensor(pack["ids"])
                pos[slot, :length] = torch.tensor(pack["pos"])
                labels[slot, :length] = torch.tensor(pack["labels"])
                for row_positions, start in pack["segments"]:
                    keys = torch.tensor(row_positions)
                    depth = torch.arange(len(row_positions))
                    mask[slot, 0, keys[start:, None], keys[None, :]] = depth[None, :] <= depth[start:, None]
                base[i] = offset + slot * width
            offset += k * width
            layout = TreeLayout.from_packs(width, [self.packs[i]["segments"] for i, _ in group])
            forwards.append(Forward(ids, pos, mask, labels, layout))
        return forwards, base
