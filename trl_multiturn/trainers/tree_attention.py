"""Per-segment attention over a packed prefix tree: each token attends its ancestors only, at the cost of the tree.

A pack (`packing.py`) lays a prefix tree out as one sequence: each row's tokens past what it shares with the rows
before it are one contiguous *segment*, and a segment's queries attend the keys of its *root path* (the ancestors'
tokens it continues, then its own tokens causally). SDPA given the pack's dense 4-D mask computes every query-key
pair of the pack, L^2 for L tokens, whatever the tree; here each segment s is one SDPA call of its n_s queries against
the P_s = d_s + n_s keys of its path (d_s: the depth at which it starts), gathered from the layer's keys and values:

    out[s] = softmax(q_s K_path(s)^T * scale + M_s) V_path(s),   M_s[i, j] = 0 if j <= d_s + i else -inf

(lower-right causal: query i of the segment sits at depth d_s + i and sees the path's keys up to itself), so a
forward computes sum_s n_s P_s pairs (`TreeLayout.pairs`) instead of k L^2. A segment that starts at the root
(d_s = 0) is plain causal attention over its own tokens (`is_causal=True`, the kernel skipping the upper triangle), and
a segment that directly continues the one before it in the pack is merged into it, so a pack that is exactly one chain
(a `full` history episode's rows) is one causal call, and a forward of such packs one `is_causal=True` call.

Sliding-window layers: transformers passes a layer's window as the `sliding_window` keyword to the attention function
(the keys less than `window` positions above the query in its row: `packing.window_mask`); a segment longer than the
window runs as tiles of `window` queries (`TreeLayout.tiles`), each tile's key range starting `window - 1` positions
above its first query, its mask cut to the band: a sliding layer computes at most about twice the window's pairs.

Hook-up: the function replaces the "sdpa" entry of transformers' `AttentionInterface` (`ALL_ATTENTION_FUNCTIONS`),
and runs only for a forward given the `TREE_LAYOUT` keyword (`packing.model_inputs` passes it; transformers carries a
model's keyword arguments down to each attention layer, as it does flash attention's `cu_seq_lens`); every other call
goes to transformers' SDPA as it is. The packed forward still passes the dense tree mask, so a model that does not
carry the keyword to its attention, or a layer with arguments this kernel does not take (a softcap, a position bias,
attention sinks), computes the same attention densely: slower, never wrong. Eager attention keeps the dense mask
(`attention_kernel`).

Not done here: FlexAttention's block-sparse masks (torch 2.13 has no FlexAttention backward on CPU) and
flash-attention's variable-length kernel (not installed here; `packing.packing_refusal` refuses flash attention).
The per-segment calls run on any device SDPA runs on; only CPU is tested.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

TREE_LAYOUT = "prefix_tree_layout"
"""The keyword by which a packed forward gives its `TreeLayout` to the attention layers."""

UNSUPPORTED = ("softcap", "position_bias", "s_aux")
"""Attention arguments the per-segment kernel does not apply: a layer given one takes the dense mask."""


@dataclass(frozen=True)
class Segment:
    """Queries at pack positions `first`..`first + n - 1` of pack `slot`, at depths `start`..`start + n - 1` of their
    row; `path` the pack positions of the row's tokens at depths 0..`start + n - 1` (ancestors, then these)."""

    slot: int
    first: int
    n: int
    start: int
    path: tuple[int, ...]


@dataclass(frozen=True)
class TreeLayout:
    """The segments of one packed forward of (k, `width`) tokens."""

    k: int
    width: int
    lengths: tuple[int, ...]
    segments: tuple[Segment, ...]
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_packs(cls, width: int, packs: list[list[tuple[list[int], int]]]) -> TreeLayout:
        """From each pack's rows as `packing._PackBuilder` keeps them: (the pack positions of the row's tokens, the
        depth from which they are the row's own), in the order the rows were added; a row with nothing of its own
        adds no segment, and one that continues the segment before it (its path that segment's path, its own tokens
        right after) is merged into it."""
        segments, lengths = [], []
        for slot, rows in enumerate(packs):
            merged: list[Segment] = []
            for path, start in rows:
                n = len(path) - start
                if n <= 0:
                    continue
                last = merged[-1] if merged else None
                if (last is not None and start == last.start + last.n and path[start] == last.first + last.n
                        and tuple(path[:start]) == last.path):
                    merged[-1] = Segment(slot, last.first, last.n + n, last.start, tuple(path))
                else:
                    merged.append(Segment(slot, path[start], n, start, tuple(path)))
            segments += merged
            lengths.append(sum(s.n for s in merged))
        return cls(len(packs), width, tuple(lengths), tuple(segments))

    @property
    def causal(self) -> bool:
        """Every pack one chain from the root: the forward is plain causal attention."""
        return all(s.start == 0 for s in self.segments) and len(self.segments) == self.k

    @property
    def pairs(self) -> int:
        """Query-key pairs the kernel computes: n (n + 1) / 2 for a segment from the root (causal), n P otherwise (a
        sliding layer computes fewer, its keys cut to the window: not priced)."""
        return sum(s.n * (s.n + 1) // 2 if s.start == 0 else s.n * len(s.path) for s in self.segments)

    def tiles(self, window: int | None) -> tuple[Segment, ...]:
        """The segments as the kernel runs them under `window`: each segment of more than `window` queries cut into
        runs of at most `window` (each a segment from its own first depth, its path ending at its last query), so
        that a run's keys span at most 2 `window` - 1 depths, the band, where the whole segment's queries would take
        every key from `window` - 1 above its first query to its last: n (n + window - 1) pairs instead of about
        2 n window. Without a window, the segments."""
        if window is None:
            return self.segments
        key = ("tiles", window)
        if key not in self._cache:
            self._cache[key] = tuple(
                Segment(s.slot, s.first + a, min(window, s.n - a), s.start + a,
                        s.path[:s.start + min(a + window, s.n)])
                for s in self.segments for a in range(0, s.n, window))
        return self._cache[key]

    def keys_and_mask(self, index: int, window: int | None, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(key positions, boolean mask (n, keys)) of tile `index` of `tiles(window)` under `window`, or (None, None)
        for plain causal attention over its own tokens; built once per forward and device, shared by its layers."""
        key = (index, window, str(device))
        segment = self.tiles(window)[index]
        if key not in self._cache:
            depth_end = segment.start + segment.n
            low = 0 if window is None else max(0, segment.start + 1 - window)
            if segment.start == 0 and (window is None or window >= segment.n):
                self._cache[key] = (None, None)
            else:
                query_depth = torch.arange(segment.start, depth_end, device=device)[:, None]
                key_depth = torch.arange(low, depth_end, device=device)[None, :]
                mask = key_depth <= query_depth
                if window is not None:
                    mask &= query_depth - key_depth < window
                positions = torch.tensor(segment.path[low:], dtype=torch.long, device=device)
                self._cache[key] = (positions, mask)
        return self._cache[key]


def attention_kernel(implementation: str | None) -> str:
    """"segments" (this module's per-segment SDPA) for models loaded with SDPA, "dense" (the 4-D tree mask) for the
    other attention implementations that take a custom mask (eager)."""
    return "segments" if implementation == "sdpa" else "dense"


def _window(sliding_window) -> int | None:
    return int(sliding_window) if sliding_window else None


def tree_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention function: with a `TREE_LAYOUT` keyword, attention per segment (the module docstring);
    without one (or with an argument this kernel does not apply), transformers' SDPA."""
    layout = kwargs.pop(TREE_LAYOUT, None)
    if layout is None or query.shape[2] != layout.width or any(kwargs.get(n) is not None for n in UNSUPPORTED):
        return _SDPA(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    window = _window(kwargs.get("sliding_window"))
    options = {"dropout_p": dropout, "scale": scaling}
    if getattr(module, "num_key_value_groups", 1) > 1:
        options["enable_gqa"] = True
    if layout.causal and (window is None or window >= max(layout.lengths)):
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, **options)
        return out.transpose(1, 2).contiguous(), None
    parts: list[list[torch.Tensor]] = [[] for _ in range(layout.k)]
    for index, segment in enumerate(layout.tiles(window)):
        s, a, b = segment.slot, segment.first, segment.first + segment.n
        positions, mask = layout.keys_and_mask(index, window, query.device)
        if positions is None:
            keys, values = key[s:s + 1, :, a:b], value[s:s + 1, :, a:b]
        else:
            keys, values = key[s:s + 1].index_select(2, positions), value[s:s + 1].index_select(2, positions)
        parts[s].append(torch.nn.functional.scaled_dot_product_attention(
            query[s:s + 1, :, a:b], keys, values, attn_mask=mask, is_causal=positions is None, **options))
    rows = []
    for s, row in enumerate(parts):
        pad = layout.width - layout.lengths[s]
        if pad:
            row.append(query.new_zeros(1, query.shape[1], pad, value.shape[-1]))
        rows.append(torch.cat(row, dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous(), None


_SDPA = AttentionInterface()["sdpa"]  # transformers' own, before the line below replaces the entry
AttentionInterface.register("sdpa", tree_sdpa_attention)
