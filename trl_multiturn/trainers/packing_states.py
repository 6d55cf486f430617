"""Prefix sharing for models whose layers carry a state along the sequence: each shared prefix forwarded once, each
branch continued from the prefix's layer states.

A recurrent or convolutional layer (the Gated DeltaNet of Qwen3.5 and Qwen3-Next, the Mamba2 mixers of Nemotron-H,
Falcon-H1 and GraniteMoeHybrid, LFM2's short convolutions) reads, at each token, a state summarising every token
before it; no attention mask separates the rows of a prefix-tree pack (`packing.py`) for it. Its state after a
prefix is what every row that continues the prefix starts its next token from, though, so the rows' prefix tree is
forwarded node by node instead:

    node = a run of tokens every row through it shares (a radix-tree edge); the rows end at node ends
    forward(children) = the model continued from cache(parent), the parent's layer states (attention keys and
                        values, convolution windows, recurrent states), forked: row i of the children's batch reads
                        row parent(i) of the parent batch's cache

which is the model's own cached forward (transformers' hybrid caches: `DynamicCache(config=...)`), so each token
computes exactly what it computes in its own row. The roots are batched left-padded, as the padded rows are (a
padding token's input is masked to zero, which leaves a state that starts at zero as it was); the children of one
forward's nodes are batched: those that end a row (leaves) together, right-padded (padding after a token changes
nothing before it, and a leaf's end state is not read); those with children of their own by equal length (their end
states are, and a padded row's state would have run over the padding). A batch holds at most the token budget of
one padded chunk (`batch_size` x W), as `packing.plan_packs`' forwards do, and the padding of all of them at most
`PAD_SHARE` of the tree's tokens (`_Batches`: siblings of unequal lengths are cut into batches by length where
their padding would exceed it). `forked_forwards` gives the forwards' shapes without running them, which
`packing="auto"` prices against the padded rows'. Gradients flow through the forked states
(`index_select` of the parent's) into the prefix's forward. Under activation checkpointing transformers' checkpointed
layers run without a cache, so there the layers' checkpointing is off and each forward is checkpointed whole
(`torch.utils.checkpoint`, its recomputation forking the parent's states anew).

The forwards are planned before any runs (`plan_forks`: the tree, and each level's batches by `_Batches`), then run
in that order (`run_forks`), so that on several processes the ranks agree on one number of forwards before running
them (`forwards.Forwards.agree`); a rank with fewer runs filler forwards (`ForkPlan.filler`, a root of two pad tokens
through the whole model, whose outputs no row reads: `packing.with_filler_forwards`), which join the backward with
zero gradient, so DDP's and FSDP's collectives meet (tests/trainers/test_distributed.py: two processes, exact
against one).

PPO (`value_model.PolicyAndValueModel`, where its policy and its critic both fork): the critic's values are read as
the entropies are, one per position (V(s_t) is the head at the position before token t), and a forward of both
models (`run_forks(..., output="both")`, the loss's) keeps two caches per forward, each model continued from its own
layer states.

Log-probs: the logit at depth d - 1 predicts token d; at a node's last position the label is the first token of each
child, one per branch (a node's last logits serve all its children). The result is laid out as
`logprobs.sequence_logps` lays out the padded rows', (B, K), 0 at padding.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint

from ..model_layers import convolution_holders, streaming_layers, text_config, unwrap
from .logprobs import token_logps_and_entropies


def padded_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int):
    """The rows of a padded batch in TRL's layout ((B, W), left-padded prompt, right-padded completion, the last K =
    `logits_to_keep` columns scored): per row its real tokens (a list), the column of its first token, and the depth
    from which its tokens are scored (W - K - first). A ValueError for a row whose tokens are not one contiguous
    run, or whose first token is in a scored column."""
    B, W = input_ids.shape
    ids_cpu, mask_cpu = input_ids.cpu(), attention_mask.cpu().bool()
    rows, offsets, scored_from = [], [], []
    for b in range(B):
        cols = mask_cpu[b].nonzero().flatten()
        if len(cols) == 0:
            rows.append([])
            offsets.append(0)
            scored_from.append(0)
            continue
        first, last = int(cols[0]), int(cols[-1])
        if last - first + 1 != len(cols):
            raise ValueError(f"row {b}: attention_mask has holes; prefix packing takes each row's real tokens as one "
                             "contiguous run (left-padded prompt, right-padded completion)")
        if first >= W - logits_to_keep:
            raise ValueError(f"row {b}: a kept column holds the row's first token, which TRL scores from a padding "
                             "position; give every row at least one prompt token")
        rows.append(ids_cpu[b, first:last + 1].tolist())
        offsets.append(first)
        scored_from.append(W - logits_to_keep - first)
    return rows, offsets, scored_from


def forks_states(model) -> bool:
    """Whether `model` is a transformers language model (or a PEFT model over one) with layers that run over the
    sequence as a stream (`model_layers.streaming_layers`) and a cache that holds every such layer's state
    (`DynamicCache(config=...)` builds a linear-attention cache layer for each), so that `forked_logps_and_entropies`
    continues its rows exactly from a shared prefix. PPO's policy-and-critic module (`value_model.PolicyAndValueModel`)
    forks where its policy and its critic both do (`run_forks` then continues each from its own states)."""
    from transformers import DynamicCache, PreTrainedModel
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    from .value_model import PolicyAndValueModel

    model = unwrap(model)
    if isinstance(model, PolicyAndValueModel):
        return forks_states(model.policy) and forks_states(model.critic)
    base = model.get_base_model() if type(model).__module__.startswith("peft.") else model
    if not isinstance(base, PreTrainedModel) or streaming_layers(model) is None:
        return False
    config = text_config(model)
    try:
        cache = DynamicCache(config=config)
    except Exception:  # noqa: BLE001 (a config transformers builds no cache from: not forkable)
        return False
    stateful = sum(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)
    return stateful > 0 and stateful == len(convolution_holders(model))


@dataclass(eq=False)
class _Node:
    """A radix-tree edge: `tokens` at depths `start`... of every row through it."""

    tokens: list[int]
    start: int
    children: dict[int, _Node] = field(default_factory=dict)
    """While the tree is built: by first token."""
    branches: list[_Node] = field(default_factory=list)
    """The children as forwarded (`_branches`)."""
    need_from: int = 1 << 62
    """The first local position whose logits some row through the node scores."""
    logp_base: tuple[int, int] = (-1, -1)
    """Flat index of the log-prob and of the entropy at local position 0 (set by the forward that runs the node);
    position p is at base + p."""
    edge_base: dict[int, int] = field(default_factory=dict)
    """Flat index of the log-prob of each child's first token (by that token) from the node's last logits."""


def _insert(roots: dict[int, _Node], row: list[int]) -> None:
    depth, children = 0, roots
    while depth < len(row):
        node = children.get(row[depth])
        if node is None:
            children[row[depth]] = _Node(row[depth:], depth)
            return
        common = len(os.path.commonprefix([node.tokens, row[depth:]]))
        if common < len(node.tokens):  # split the edge where the row leaves it (or ends)
            tail = _Node(node.tokens[common:], node.start + common, node.children)
            node.tokens, node.children = node.tokens[:common], {tail.tokens[0]: tail}
        depth += common
        children = node.children


def _branches(children: dict[int, _Node]) -> list[_Node]:
    """`children` as a list, each node's own children listed in `_Node.branches`, a one-token node with children
    replaced by its children with its token prepended (they re-forward it): a one-token forward from a cache takes
    the layers' decode path, whose reference kernels update the state in place (Mamba2's `selective_state_update`),
    which autograd cannot differentiate."""
    out = []
    for node in children.values():
        node.branches = _branches(node.children)
        if len(node.tokens) == 1 and node.branches:
            for child in node.branches:
                child.tokens, child.start = node.tokens + child.tokens, node.start
            out += node.branches
        else:
            out.append(node)
    return out


def _path(roots: list[_Node], row: list[int]) -> list[_Node]:
    """The nodes of `row`, each its tokens at their depths; the row's last token is missing where its node was
    merged into its children (`_branches`): no scored logit reads it."""
    path, depth, branches = [], 0, roots
    while depth < len(row):
        node = next((n for n in branches if row[depth:depth + len(n.tokens)] == n.tokens), None)
        if node is None:
            break
        path.append(node)
        depth += len(node.tokens)
        branches = node.branches
    return path


def _cache_class():
    from transformers import DynamicCache

    class ForkableCache(DynamicCache):
        """transformers' `DynamicCache` whose recurrent states are read as copies: the layers update a state in
        place (`copy_`) after their scan read it as its initial state, which autograd saved for the backward."""

        def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
            state = super().get_recurrent_state(layer_idx, state_idx)
            return None if state is None else state.clone()

    return ForkableCache


def _fork(cache, index: torch.Tensor):
    """A new cache whose row i holds row `index[i]` of `cache`'s states (every tensor with a batch dimension;
    counters copied)."""
    def fork(value):
        if isinstance(value, torch.Tensor):
            return value.index_select(0, index) if value.dim() > 0 else value.clone()
        if isinstance(value, dict):
            return {k: fork(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fork(v) for v in value]
        return value

    child = copy.copy(cache)
    child.layers = []
    for layer in cache.layers:
        new = copy.copy(layer)
        for name, value in vars(layer).items():
            setattr(new, name, fork(value))
        child.layers.append(new)
    return child


@dataclass(eq=False)
class _Forward:
    """One forked forward: `nodes`, continued from rows `parents` of forward `parent`'s layer states (`parent` an
    index into `ForkPlan.forwards`; None: the roots, from no state, left-padded)."""

    nodes: list[_Node]
    parent: int | None = None
    parents: torch.Tensor | None = None
    children: int = 0
    """Forwards continued from this one's states."""


@dataclass(frozen=True)
class ForkPlan:
    """The forked forwards of B rows (`plan_forks`), in the order they run, each after the forward it continues: a
    tree level's nodes batched by `_Batches`, then its children's forwards depth first. Known before any forward
    runs, so that the ranks of several processes agree on one number of forwards (`forwards.Forwards.agree`)."""

    forwards: list[_Forward]
    rows: list[list[int]]
    offsets: list[int]
    paths: list[list[_Node]]
    width: int
    logits_to_keep: int
    pad_token_id: int

    @staticmethod
    def filler(pad_token_id: int) -> _Forward:
        """A filler forward (`packing.with_filler_forwards`): a root of two pad tokens, run as the roots are (the
        narrowest forward, `_PAIR`), whose outputs no row reads."""
        return _Forward([_Node([pad_token_id] * len(_PAIR.tokens), 0)])


def plan_forks(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
               batch_size: int | None = None, *, pad_token_id: int = 0) -> ForkPlan:
    """The prefix tree of the rows of a padded batch (TRL's layout, as `padded_rows` reads it) and the forwards that
    run it: each batch of one tree level within the token budget of one padded chunk (`batch_size` x W)."""
    B, W = input_ids.shape
    rows, offsets, scored_from = padded_rows(input_ids, attention_mask, logits_to_keep)
    roots = _tree(rows)
    batches = _Batches(roots, (batch_size or B) * W)
    paths = [_path(roots, row) if row else [] for row in rows]
    for b, path in enumerate(paths):
        for node in path:  # the logit at depth d - 1 predicts token d, for d >= scored_from
            node.need_from = min(node.need_from, max(scored_from[b] - 1 - node.start, 0))
    forwards: list[_Forward] = []

    def schedule(chunk: list[tuple[int, _Node]], parent: int | None) -> None:
        forward = _Forward([node for _, node in chunk], parent,
                           None if parent is None else torch.tensor([i for i, _ in chunk], dtype=torch.long))
        forwards.append(forward)
        here = len(forwards) - 1
        for child in batches([(i, c) for i, node in enumerate(forward.nodes) for c in node.branches]):
            forward.children += 1
            schedule(child, here)

    for chunk in batches([(0, node) for node in roots], left_padded=True):
        schedule(chunk, None)
    return ForkPlan(forwards, rows, offsets, paths, W, logits_to_keep, pad_token_id)


def forked_logps_and_entropies(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                               batch_size: int | None = None, compute_entropy: bool = False, *,
                               temperature: float, pad_token_id: int = 0):
    """(logps (B, K), entropies (B, K) or None): what `logprobs.sequence_logps(model, input_ids, attention_mask,
    logits_to_keep, temperature=..., compute_entropy=...)` returns, each shared prefix of the rows forwarded once and
    each branch continued from the prefix's layer states (the module docstring): `run_forks` of `plan_forks`."""
    plan = plan_forks(input_ids, attention_mask, logits_to_keep, batch_size, pad_token_id=pad_token_id)
    return run_forks(model, plan, compute_entropy, temperature=temperature)[:2]


OUTPUTS = ("policy", "values", "both")
"""`run_forks`' outputs: the policy's log-probs (and entropies), the critic's values of a
`value_model.PolicyAndValueModel`, or both from one forward of each (PPO's loss)."""


def run_forks(model, plan: ForkPlan, compute_entropy: bool = False, *, temperature: float | None = None,
              output: str = "policy"):
    """(logps (B, K) or None, entropies (B, K) or None, values (B, K) or None) of `plan`'s rows, its forwards run in
    order, each forward's layer states kept until the last forward continued from them has run.

    `output` (`OUTPUTS`): "policy" the log-probs (`forked_logps_and_entropies`); for a
    `value_model.PolicyAndValueModel`, "values" its critic's V(s_t), the head at the position before token t (as
    `packing.packed_values` reads them, 0 at padding), and "both" its policy's log-probs and entropies and its
    critic's values from one forward of each (`model(..., output="both")`): each model continued from its own layer
    states (two caches per forward, forked alike). A value is read at the position an entropy is: one per position,
    whichever child follows it. `temperature` scales the logits (needed where log-probs are scored)."""
    if output not in OUTPUTS:
        raise ValueError(f"output={output!r}: choose one of {OUTPUTS}")
    with_logps, with_values = output != "values", output != "policy"
    if with_logps and temperature is None:
        raise ValueError(f"output={output!r} scores log-probs: give the sampling temperature")
    B, W, K = len(plan.rows), plan.width, plan.logits_to_keep
    device = next(model.parameters()).device
    cache_class = _cache_class()
    configs = [text_config(part) for part in ((model,) if with_logps else ()) + (
        (unwrap(model).critic,) if with_values else ())]  # one cache per model run, in `call`'s order
    checkpointed = checkpoints_layers(model)
    logps_out, entropies_out, values_out = [], [], []
    sizes = [0, 0]  # flat lengths of the log-prob and the per-position (entropy, value) outputs so far
    states: dict[int, tuple] = {}  # forward -> (its caches, its rows' mask, forwards still to continue from it)

    def call(inputs: dict, caches):
        """(logits or None, values or None) of one forward, each model from its cache in `caches` (None: none)."""
        caches = caches or (None,) * len(configs)
        if output == "policy":
            return model(**inputs, cache=caches[0]).logits, None
        if output == "values":
            return None, model(**inputs, output="values", critic_cache=caches[0])
        out, values = model(**inputs, output="both", cache=caches[0], critic_cache=caches[1])
        return out.logits, values

    def run(nodes: list[_Node], caches, parents: torch.Tensor | None, past_mask: torch.Tensor):
        """Forward `nodes`, continued from rows `parents` of `caches` (None: the roots, left-padded), whose tokens
        and padding so far are `past_mask`'s rows; its caches (None without branches) and mask."""
        width = max(len(node.tokens) for node in nodes + [_PAIR])  # one token from a cache: `_branches`
        cols = [width - len(node.tokens) if caches is None else 0 for node in nodes]  # where each node's tokens start
        first = min(col + min(node.need_from, len(node.tokens) - 1) for col, node in zip(cols, nodes, strict=True))
        keep = width - first
        ids = torch.full((len(nodes), width), plan.pad_token_id, dtype=torch.long)
        segment = torch.zeros(len(nodes), width, dtype=torch.long)
        positions = torch.zeros(len(nodes), width, dtype=torch.long)
        for i, (col, node) in enumerate(zip(cols, nodes, strict=True)):
            ids[i, col:col + len(node.tokens)] = torch.tensor(node.tokens)
            segment[i, col:col + len(node.tokens)] = 1
            positions[i, col:col + len(node.tokens)] = node.start + torch.arange(len(node.tokens))
        mask = torch.cat([past_mask if parents is None else past_mask[parents], segment], dim=1)
        has_children = any(node.branches for node in nodes)
        inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device),
                  "use_cache": has_children, "logits_to_keep": keep}
        index = parents.to(device) if parents is not None else None

        def own_caches(parent):
            if parent is not None:
                return tuple(_fork(cache, index) for cache in parent)
            return tuple(cache_class(config=config) for config in configs) if has_children else None

        if checkpointed:
            runs = []  # the caches of the first run; a recomputation in the backward fills forks of its own

            def forward(parent):
                with _layers_unchecked(model):
                    own = own_caches(parent)
                    runs.append(own)
                    return call(inputs, own)

            logits, values = torch.utils.checkpoint.checkpoint(forward, caches, use_reentrant=False)
            caches = runs[0]
        else:
            caches = own_caches(caches)
            logits, values = call(inputs, caches)  # logits (n, keep, V): columns first ... width - 1
        for i, (col, node) in enumerate(zip(cols, nodes, strict=True)):
            node.logp_base = (sizes[0] + i * keep + col - first, sizes[1] + i * keep + col - first)
        if logits is not None:
            labels = torch.zeros(len(nodes), keep, dtype=torch.long)
            edges, edge_labels = [], []
            for i, (col, node) in enumerate(zip(cols, nodes, strict=True)):
                for p in range(max(first - col, 0), len(node.tokens) - 1):
                    labels[i, col + p - first] = node.tokens[p + 1]
                for token in dict.fromkeys(child.tokens[0] for child in node.branches):
                    edges.append(i * keep + col + len(node.tokens) - 1 - first)
                    edge_labels.append(token)
            lp, ent = token_logps_and_entropies(logits, labels.to(device), temperature, compute_entropy)
            flat_logits = logits.reshape(-1, logits.shape[-1])
            edge_lp, _ = token_logps_and_entropies(flat_logits[torch.tensor(edges, dtype=torch.long, device=device)],
                                                   torch.tensor(edge_labels, dtype=torch.long, device=device),
                                                   temperature)
            for e, (position, token) in enumerate(zip(edges, edge_labels, strict=True)):
                nodes[position // keep].edge_base[token] = sizes[0] + lp.numel() + e
            logps_out.extend([lp.reshape(-1), edge_lp])
            sizes[0] += lp.numel() + edge_lp.numel()
            if compute_entropy:
                entropies_out.append(ent.reshape(-1))
        if values is not None:
            values_out.append(values[:, first:].reshape(-1))
        sizes[1] += len(nodes) * keep
        return caches, mask

    for at, forward in enumerate(plan.forwards):
        if forward.parent is None:
            caches, past_mask = None, torch.zeros(len(forward.nodes), 0, dtype=torch.long)
        else:
            caches, past_mask, left = states.pop(forward.parent)
            if left > 1:
                states[forward.parent] = (caches, past_mask, left - 1)
        caches, mask = run(forward.nodes, caches, forward.parents, past_mask)
        if forward.children:
            states[at] = (caches, mask, forward.children)

    index_lp = torch.zeros(B, K, dtype=torch.long)
    index_position = torch.zeros(B, K, dtype=torch.long)
    valid = torch.zeros(B, K, dtype=torch.bool)
    for b, path in enumerate(plan.paths):
        n = len(plan.rows[b])
        located = []  # per depth: (node index in path, local position)
        for k, node in enumerate(path):
            located += [(k, p) for p in range(len(node.tokens))]
        for j in range(K):
            depth = W - K + j - plan.offsets[b]
            if 1 <= depth < n:
                k, p = located[depth - 1]
                node = path[k]
                if with_logps:
                    index_lp[b, j] = (node.edge_base[plan.rows[b][depth]] if p == len(node.tokens) - 1
                                      else node.logp_base[0] + p)
                index_position[b, j] = node.logp_base[1] + p
                valid[b, j] = True
    valid = valid.to(device)

    def gather(out: list[torch.Tensor], index: torch.Tensor) -> torch.Tensor | None:
        return torch.cat(out)[index.to(device)].masked_fill(~valid, 0) if out else None

    return gather(logps_out, index_lp), gather(entropies_out, index_position), gather(values_out, index_position)


def _tree(rows: list[list[int]]) -> list[_Node]:
    """The roots of the rows' prefix tree as forwarded (`_branches`)."""
    tree: dict[int, _Node] = {}
    for row in rows:
        if row:
            _insert(tree, row)
    return _branches(tree)


def forked_forwards(plan: ForkPlan) -> list[tuple[int, int, int]]:
    """The forwards `run_forks` runs for `plan` (`plan_forks`), without a model: per forward, in the order they run,
    (n, q, kv): its batch of n nodes, each padded to q tokens, and the keys its attention reads (the forked cache's
    columns and its own q)."""
    shapes: list[tuple[int, int, int]] = []
    for forward in plan.forwards:
        width = max(len(node.tokens) for node in forward.nodes + [_PAIR])
        past = 0 if forward.parent is None else shapes[forward.parent][2]
        shapes.append((len(forward.nodes), width, past + width))
    return shapes


class _Batches:
    """(parent row, node) pairs batched into forwards (`__call__`), longest first, each batch within `budget` tokens
    (at least one node): continuing from a cache, the leaves (right-padded) and the nodes with branches by equal
    length (their end states are read, and would have run over right padding); `left_padded` (the roots, from no
    state) padded on the left, which leaves each layer's state as no token would (a padding token's input is masked
    to zero, as in the padded rows).

    Padding is spent from one allowance for the whole tree, `PAD_SHARE` of its real tokens: a node joins the batch
    before it (n nodes padded to the longest, L, at least `_PAIR`'s 2 tokens) while the padding that adds, L - len,
    is left in the allowance (or is no more than it would have alone: a one-token node is padded to 2 wherever it
    goes), else it starts a new batch. So the forwarded tokens, padding included, are at most 1 + PAD_SHARE times
    the real ones plus one per one-token node, and small siblings of different lengths still share a forward where
    the tree's other tokens leave room for their padding."""

    def __init__(self, roots: list[_Node], budget: int):
        self.budget = budget
        self.allowance = PAD_SHARE * _real_tokens(roots)

    def __call__(self, members: list[tuple[int, _Node]], left_padded: bool = False) -> list[list[tuple[int, _Node]]]:
        groups: dict[int | None, list[tuple[int, _Node]]] = {}
        for parent, node in sorted(members, key=lambda member: -len(member[1].tokens)):
            groups.setdefault(len(node.tokens) if node.branches and not left_padded else None,
                              []).append((parent, node))
        out = []
        for group in groups.values():
            for member in group:  # longest first: a batch's width is its first node's
                length = len(member[1].tokens)
                alone = max(length, len(_PAIR.tokens))
                if out and out[-1][0] is group and (len(out[-1][2]) + 1) * out[-1][1] <= self.budget \
                        and out[-1][1] - length <= max(self.allowance, alone - length):
                    out[-1][2].append(member)
                else:
                    out.append((group, alone, [member]))
                self.allowance -= out[-1][1] - length
        return [batch for _, _, batch in out]


def _real_tokens(nodes: list[_Node]) -> int:
    return sum(len(node.tokens) + _real_tokens(node.branches) for node in nodes)


def checkpoints_layers(model) -> bool:
    """Whether `model`'s layers checkpoint their activations in this forward (training, gradients on, activation
    checkpointing enabled): transformers' checkpointed layers then run without a cache (a replayed layer would update
    it twice)."""
    model = unwrap(model)
    return (model.training and torch.is_grad_enabled()
            and any(getattr(module, "gradient_checkpointing", False) for module in model.modules()))


@contextmanager
def _layers_unchecked(model):
    """`model`'s layers with their activation checkpointing off, restored after."""
    modules = [m for m in unwrap(model).modules() if getattr(m, "gradient_checkpointing", False)]
    for module in modules:
        module.gradient_checkpointing = False
    try:
        yield
    finally:
        for module in modules:
            module.gradient_checkpointing = True


PAD_SHARE = 0.04
"""The most padding the forked forwards of one tree hold together, as a share of its real tokens (`_Batches`): 4%,
so that the forwarded tokens stay within 1.05 of the rows' prefix-tree tokens with room for the one-token nodes that
their children re-forward (`_branches`)."""

_PAIR = _Node([0, 0], 0)
"""A node of two tokens: the narrowest forward (`run`)."""
