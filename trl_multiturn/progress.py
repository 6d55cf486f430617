"""Progress bars for the slow loops (game generation, evaluation, a training step's rollout), as TRL,
`transformers` and `datasets` show them.

Bars go to stderr through `huggingface_hub`'s tqdm, so `HF_HUB_DISABLE_PROGRESS_BARS=1` or
`huggingface_hub.utils.disable_progress_bars()` turns them all off; each call site also takes a flag
(`progress=False`, or a trainer config's `disable_tqdm`).
"""

from __future__ import annotations


def progress_bar(*, total: int, desc: str, unit: str = "it", enabled: bool = True, leave: bool = True):
    """A tqdm bar to `update(n)`, used as a context manager; a bar that prints nothing when `enabled` is False.
    `leave=False` clears it from the screen when it closes."""
    from huggingface_hub.utils import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, leave=leave)


class TurnProgress:
    """A bar over episodes that moves as each one ends, turn by turn, with the turn reached: an `EpisodeRunner`'s
    `on_progress(finished, episodes, turn)` (turn 0 starts a runner call).

    With `total`, one bar over `total` episodes across the runner's calls (an evaluation's tasks, played in batches);
    without, a bar per call (a training step's rollout), cleared from the screen when its episodes have all ended.
    `close()` ends the bar."""

    def __init__(self, desc: str, total: int | None = None, enabled: bool = True, unit: str = "episode"):
        self.desc, self.total, self.enabled, self.unit = desc, total, enabled, unit
        self.bar = None
        self._before = 0  # episodes ended in the earlier calls (with `total`)
        self._finished = 0  # episodes ended so far in this call

    def __call__(self, finished: int, episodes: int, turn: int) -> None:
        if turn == 0:  # a new call: its episodes join the bar over `total`, or get a bar of their own
            if self.total is None:
                self.close()
            else:
                self._before += self._finished
            self._finished = 0
        if self.bar is None:
            self.bar = progress_bar(total=self.total or episodes, desc=self.desc, unit=self.unit,
                                    enabled=self.enabled, leave=self.total is not None)
        self.bar.update(self._before + finished - self.bar.n)
        self.bar.set_postfix_str(f"turn {turn}", refresh=True)
        self._finished = finished
        if self.total is None and finished == episodes:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> TurnProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
