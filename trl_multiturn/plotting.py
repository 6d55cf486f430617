"""Learning curves from the logs the trainers write: `trl-multiturn plot RUN_DIR... -o curves.png`.

A run folder's `trainer_state.json` (written by `save_model` and with every checkpoint) holds TRL's `log_history`:
one record per logging step. The newest record set is used: the folder's own file, else its latest
`checkpoint-N/`'s. Every run is drawn on the same panels, one colour per run; a panel nothing was logged for (KL at
beta 0, success in an SFT run) is left out. Held-out success rates are drawn as stars on the success panel: the
`heldout/success_rate` records of the log, and each evaluation kept in the folder (`eval_results*.json`, of the
model the folder holds: drawn at the run's last step).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CURVES = {
    "loss": "loss",
    "success rate": "episodes/success_rate",
    "mean return": "episodes/mean_return",
    "mean turns": "episodes/mean_turns",
    "KL": "kl",
    "entropy": "entropy",
}
"""Panel title -> the logged key (the same key with `eval_` in front is drawn dashed when present)."""


def _checkpoint_step(state_file: Path) -> int:
    step = state_file.parent.name.removeprefix("checkpoint-")
    return int(step) if step.isdigit() else -1


def find_trainer_state(run_dir: str | os.PathLike) -> Path:
    """`run_dir/trainer_state.json`, else the one in its latest `checkpoint-N/`; raise naming the folder if none."""
    run_dir = Path(run_dir)
    own = run_dir / "trainer_state.json"
    if own.is_file():
        return own
    checkpoints = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=_checkpoint_step)
    if not checkpoints:
        raise FileNotFoundError(f"{run_dir} holds no trainer_state.json (nor checkpoint-N/trainer_state.json): pass "
                                "a trainer's output_dir after save_model, or one with saved checkpoints")
    return checkpoints[-1]


def log_curves(log_history: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """Per logged key of `CURVES` (and its `eval_` twin): (steps, values) of the records that have it."""
    curves = {}
    for key in CURVES.values():
        for name in (key, f"eval_{key}"):
            points = [(rec["step"], rec[name]) for rec in log_history if name in rec and "step" in rec]
            if points:
                curves[name] = ([s for s, _ in points], [v for _, v in points])
    return curves


HELDOUT_KEY = "heldout/success_rate"


def heldout_points(run_dir: str | os.PathLike, log_history: list[dict]) -> tuple[list[int], list[float]]:
    """(steps, held-out success rates) of a run: the log's `heldout/success_rate` records, then each evaluation
    kept in the folder at the run's last logged step (where the log has none there already)."""
    from .evaluation import load_eval_results

    points = {rec["step"]: rec[HELDOUT_KEY] for rec in log_history if HELDOUT_KEY in rec and "step" in rec}
    last = max((rec["step"] for rec in log_history if "step" in rec), default=0)
    kept = [record["summary"]["success_rate"] for record in load_eval_results(run_dir)
            if record.get("summary", {}).get("success_rate") is not None]
    steps = sorted(points)
    values = [points[step] for step in steps]
    if last not in points:
        steps, values = steps + [last] * len(kept), values + kept
    return steps, values


def plot_runs(run_dirs: list[str | os.PathLike], output: str | os.PathLike, labels: list[str] | None = None):
    """Draw each run's curves on one figure of `CURVES` panels against the training step and save it to `output`
    (the format follows the suffix: .png, .pdf, .svg). Returns the matplotlib figure."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'trl-multiturn[plot]' (or matplotlib)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    labels = labels or [Path(d).resolve().name for d in run_dirs]
    if len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs: give one label per run")
    runs = []
    for run_dir in run_dirs:
        history = json.loads(find_trainer_state(run_dir).read_text())["log_history"]
        runs.append((log_curves(history), heldout_points(run_dir, history)))
    panels = {title: key for title, key in CURVES.items()
              if any(key in curves or f"eval_{key}" in curves for curves, _ in runs)
              or (title == "success rate" and any(steps for _, (steps, _) in runs))}
    if not panels:
        raise ValueError(f"no curve to draw: none of {sorted(CURVES.values())} is logged in "
                         f"{[str(d) for d in run_dirs]}")
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for index, ((curves, (held_steps, held_values)), label) in enumerate(zip(runs, labels)):
        colour = f"C{index}"
        for ax, (title, key) in zip(axes[0], panels.items()):
            for name, style in ((key, "-"), (f"eval_{key}", "--")):
                if name in curves:
                    steps, values = curves[name]
                    ax.plot(steps, values, style, color=colour, marker=".",
                            label=label if name == key else f"{label} (eval)")
            if title == "success rate" and held_steps:
                ax.plot(held_steps, held_values, "*", color=colour, markersize=12, label=f"{label} (held-out)")
    for ax, title in zip(axes[0], panels):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    return fig
