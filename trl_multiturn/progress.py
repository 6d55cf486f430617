"""Progress bars for the slow loops (game generation, evaluation), as TRL, `transformers` and `datasets` show them.

Bars go to stderr through `huggingface_hub`'s tqdm, so `HF_HUB_DISABLE_PROGRESS_BARS=1` or
`huggingface_hub.utils.disable_progress_bars()` turns them all off; each call site also takes a flag
(`progress=False`, or a trainer config's `disable_tqdm`).
"""

from __future__ import annotations


def progress_bar(*, total: int, desc: str, unit: str = "it", enabled: bool = True):
    """A tqdm bar to `update(n)`, used as a context manager; a bar that prints nothing when `enabled` is False."""
    from huggingface_hub.utils import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True)
