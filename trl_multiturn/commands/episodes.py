"""`trl-multiturn episodes RUN_DIR`: one self-contained HTML page of the episodes a run's evaluations played.

Every `eval_results*.json` in the folder (a trainer's held-out evaluation, each `trl-multiturn eval`), and the starting
model's `start_eval_results.json` (played on the same tasks before training, shown first), contributes its episodes:
the conversation turn by turn (the environment's observations, the model's replies, the action read from each
reply), each turn's reward coloured (green above zero, red below, the stronger the larger), its advantage too when
the record has one, and the outcome (won, lost, failed with its reason). Buttons filter won / lost / failed; the
settings the episodes were played with head each evaluation. No script or style is fetched from anywhere: the page
opens offline, from disk, in any browser.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

from ..evaluation import load_eval_results
from ..model_card import load_start_result

PAGE_FILE = "episodes.html"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; max-width: 70em; color: #222; }
.filters button { margin-right: .4em; padding: .3em .8em; cursor: pointer; }
.filters button.active { background: #333; color: #fff; }
.episode { border: 1px solid #ccc; border-radius: 6px; margin: .6em 0; padding: .2em .8em; }
.episode.won { border-left: 6px solid #2a2; } .episode.lost { border-left: 6px solid #c80; }
.episode.failed { border-left: 6px solid #c22; }
.episode summary { cursor: pointer; font-weight: 600; padding: .3em 0; }
.turn { margin: .4em 0 .8em 0; }
.observation { white-space: pre-wrap; background: #f4f4f4; padding: .4em; border-radius: 4px; }
.reply { white-space: pre-wrap; padding: .4em; border-radius: 4px; margin-top: .3em; }
.meta { font-size: .85em; color: #555; }
table.settings { border-collapse: collapse; font-size: .85em; }
table.settings td { border: 1px solid #ddd; padding: .1em .5em; }
"""

_SCRIPT = """
function show(kind) {
  for (const b of document.querySelectorAll('.filters button')) b.classList.toggle('active', b.dataset.kind === kind);
  let shown = 0;
  for (const e of document.querySelectorAll('.episode')) {
    const on = kind === 'all' || e.classList.contains(kind);
    e.style.display = on ? '' : 'none';
    shown += on;
  }
  document.getElementById('shown').textContent = shown;
}
"""


def reward_colour(value: float, scale: float) -> str:
    """Background for a turn with reward (or advantage) `value`: white at 0, towards green (value > 0) or red
    (value < 0) with opacity |value| / scale, capped at 0.6 so the text stays readable."""
    if not scale or not value:
        return "transparent"
    alpha = min(0.6, abs(value) / scale * 0.6)
    return f"rgba(40, 170, 40, {alpha:.2f})" if value > 0 else f"rgba(210, 40, 40, {alpha:.2f})"


def outcome(record: dict) -> str:
    """"won", "lost" or "failed": the class and filter an episode's outcome record falls under."""
    return "failed" if record.get("failed") else "won" if record.get("won") else "lost"


def _turns(messages: list[dict]) -> list[tuple[str | None, str, str | None]]:
    """(observation shown before the reply, the reply, the observation after it) per assistant message."""
    turns, before = [], None
    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            after = messages[k + 1]["content"] if k + 1 < len(messages) else None
            turns.append((before, message["content"], after))
            before = None
        elif message["role"] != "system" and not turns:
            before = message["content"]
    return turns


def episode_html(index: int, record: dict, scale: float) -> str:
    """One episode as a collapsible block: the first observation, then per turn the reply (coloured by its
    reward), the action read from it, the reward (and advantage), and the observation that answered it."""
    kind = outcome(record)
    task = ", ".join(f"{k}={v}" for k, v in (record.get("task") or {}).items())
    rewards = record.get("turn_rewards") or []
    advantages = record.get("turn_advantages") or []
    actions = record.get("actions") or []
    head = (f"#{index} {kind}" + (f" ({html.escape(str(record.get('failure')))})" if kind == "failed" else "")
            + f" &middot; {record.get('num_turns', len(rewards))} turns &middot; return "
            f"{float(record.get('return', 0.0)):.3f}")
    parts = [f'<details class="episode {kind}"><summary>{head}</summary>',
             f'<div class="meta">task: {html.escape(task)}</div>']
    turns = _turns(record.get("messages") or [])
    if turns and turns[0][0] is not None:
        parts.append(f'<div class="observation">{html.escape(turns[0][0])}</div>')
    for k, (_, reply, after) in enumerate(turns):
        reward = rewards[k] if k < len(rewards) else 0.0
        advantage = advantages[k] if k < len(advantages) else None
        action = actions[k] if k < len(actions) else None
        colour = reward_colour(advantage if advantage is not None else reward, scale)
        meta = [f"turn {k + 1}", f"reward {reward:+.3f}"]
        if advantage is not None:
            meta.append(f"advantage {advantage:+.3f}")
        meta.append("action: " + (html.escape(repr(action)) if action is not None else "<i>unreadable</i>"))
        parts.append(f'<div class="turn"><div class="reply" style="background: {colour}">{html.escape(reply)}'
                     f'</div><div class="meta">{" &middot; ".join(meta)}</div>')
        if after is not None:
            parts.append(f'<div class="observation">{html.escape(after)}</div>')
        parts.append("</div>")
    parts.append("</details>")
    return "\n".join(parts)


def episode_text(record: dict) -> str:
    """One episode's outcome record (`EvalResult.outcomes()`) as terminal text, turn by turn: what the model was
    shown, its reply, the action read from it and the turn's reward, then the outcome."""
    task = ", ".join(f"{k}={v}" for k, v in (record.get("task") or {}).items())
    lines = [f"=== episode ({task})"]
    turns = _turns(record.get("messages") or [])
    rewards, actions = record.get("turn_rewards") or [], record.get("actions") or []
    if turns and turns[0][0] is not None:
        lines.append(f"observation: {turns[0][0]}")
    for k, (_, reply, after) in enumerate(turns):
        action = actions[k] if k < len(actions) else None
        reward = rewards[k] if k < len(rewards) else 0.0
        lines.append(f"--- turn {k + 1}: reward {reward:+.3f}, action "
                     + (repr(action) if action is not None else "unreadable"))
        lines.append(f"reply: {reply}")
        if after is not None:
            lines.append(f"observation: {after}")
    kind, turns_played = outcome(record), record.get("num_turns", len(turns))
    lines.append(f"=== {kind}" + (f": {record.get('failure')}" if kind == "failed" else "")
                 + f" after {turns_played} turns, return {float(record.get('return', 0.0)):.3f}")
    return "\n".join(lines)


def _settings_table(settings: dict) -> str:
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(json.dumps(v, default=str))}</td></tr>"
                   for k, v in sorted(settings.items()))
    return f'<table class="settings">{rows}</table>'


def episodes_page(evaluations: list[dict], title: str) -> str:
    """The whole page for `evaluations` (records as `load_eval_results` returns them)."""
    records = [r for evaluation in evaluations for r in evaluation.get("outcomes", [])]
    values = [abs(v) for r in records for v in (r.get("turn_advantages") or r.get("turn_rewards") or [])]
    scale = max(values, default=0.0)
    counts = {kind: sum(outcome(r) == kind for r in records) for kind in ("won", "lost", "failed")}
    buttons = "".join(f'<button data-kind="{kind}" onclick="show(\'{kind}\')">{kind} ({n})</button>'
                      for kind, n in (("all", len(records)), *counts.items()))
    body = [f"<h1>{html.escape(title)}</h1>",
            f'<div class="filters">{buttons} <span class="meta"><span id="shown">{len(records)}</span> shown'
            "</span></div>"]
    index = 0
    for evaluation in evaluations:
        summary = evaluation.get("summary") or {}
        where = ", ".join(str(evaluation[key]) for key in ("env", "split", "tasks") if evaluation.get(key))
        label = f" ({html.escape(evaluation['label'])})" if evaluation.get("label") else ""
        body.append(f"<h2>{html.escape(evaluation.get('file', 'evaluation'))}{label}"
                    f"{f' ({html.escape(where)})' if where else ''}: {summary.get('successes', '?')}/"
                    f"{summary.get('n', '?')} won, {summary.get('failed', 0)} failed</h2>")
        body.append(f"<details><summary>settings</summary>{_settings_table(evaluation.get('settings') or {})}"
                    "</details>")
        for record in evaluation.get("outcomes", []):
            index += 1
            body.append(episode_html(index, record, scale))
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head>\n<body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def write_episodes_page(run_dir: str | os.PathLike, output: str | os.PathLike | None = None) -> Path:
    """Write the page of every evaluation kept in `run_dir` to `output` (default `run_dir/episodes.html`); a
    FileNotFoundError naming the folder when it keeps none."""
    start = load_start_result(run_dir)
    evaluations = ([{**start, "label": f"the starting model ({start.get('model')}), before training"}] if start
                   else []) + load_eval_results(run_dir)
    if not evaluations:
        raise FileNotFoundError(f"{run_dir}: no eval_results*.json here; evaluate the model first "
                                f"(trl-multiturn eval --model_name_or_path {run_dir})")
    path = Path(output) if output else Path(run_dir) / PAGE_FILE
    path.write_text(episodes_page(evaluations, f"Episodes of {Path(run_dir).resolve().name}"))
    return path


def add_episodes_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "episodes", help="Write one HTML page of the episodes a model folder's evaluations played.",
        description="Reads every eval_results*.json in RUN_DIR (the trainer's held-out evaluation, each "
                    "`trl-multiturn eval`) and writes a self-contained page: each episode turn by turn, rewards "
                    "coloured, filters for won / lost / failed.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="A model folder (a trainer's output_dir).")
    parser.add_argument("-o", "--output", help=f"The page to write (default: RUN_DIR/{PAGE_FILE}).")
    parser.set_defaults(func=_episodes_command)


def _episodes_command(args) -> int:
    print(f"wrote {write_episodes_page(args.run_dir, args.output)}")
    return 0
