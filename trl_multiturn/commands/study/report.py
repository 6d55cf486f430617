"""The study's report: stale runs, the results table (Wilson intervals, exact McNemar tests against the start and
the first run), the pre-registered comparisons with Holm's adjustment, the figure, and the power table."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...statistics import games_for_power, holm, mcnemar_exact, mcnemar_power
from .results import Results
from .spec import Study, short


def _as_json(value):
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def stale_runs(study: Study, results: Results) -> dict[str, str]:
    """The finished runs whose records no longer describe what the study file resolves to, with the reason: the
    run's recorded settings, or the recorded inputs of the SFT or RL stage it used, differ from the run's as it
    resolves now (the file changed, or the results were written while one run's changes leaked into another's)."""
    stale = {}
    for run in study.runs:
        record = results.data["runs"].get(run.name)
        if not record or "eval" not in record:
            continue
        checks = [("its settings", record.get("settings"), run.settings())]
        if record.get("sft"):
            checks.append(("its SFT stage", results.data["sft"].get(record["sft"], {}).get("inputs"),
                           run.sft_inputs()))
        if "rl" in record:
            checks.append(("its RL stage", record["rl"].get("inputs"), run.rl_inputs()))
        differ = [what for what, recorded, now in checks if _as_json(recorded) != _as_json(now)]
        if differ:
            stale[run.name] = f"{' and '.join(differ)} differ from the study file's"
    return stale


def withdraw_stale(study: Study, results: Results) -> dict[str, str]:
    """Move the stale runs' records (`stale_runs`) to the results' `withdrawn` section, with the reason, so that
    the file keeps what was measured but no table shows it; returns what was withdrawn."""
    stale = stale_runs(study, results)
    for name, reason in stale.items():
        results.data.setdefault("withdrawn", {})[name] = {**results.data["runs"].pop(name), "withdrawn": reason}
    results.save()
    return stale


def table_rows(study: Study, results: Results) -> list[dict]:
    """One row per finished run, in the study's order: success with its Wilson 95% interval, the paper's number,
    wall time, the starting policy's held-out success where it was played, and exact McNemar tests against the
    starting policy and against the first run, where both played the same games. Stale runs (`stale_runs`) are
    left out."""
    rows, first = [], None
    stale = stale_runs(study, results)
    for run in study.runs:
        record = results.data["runs"].get(run.name)
        if not record or "eval" not in record or run.name in stale:
            continue
        ev = record["eval"]
        sft = results.data["sft"].get(record.get("sft") or "", {})
        start = results.data.get("start", {}).get(record.get("start") or "")
        seconds = (sft.get("seconds", 0) + record.get("rl", {}).get("seconds", 0) + ev["seconds"]
                   + (start or {}).get("seconds", 0))
        row = {"run": run.name, "changed": run.changed, "successes": ev["successes"], "n": ev["n"],
               "success_rate": ev["successes"] / ev["n"] if ev["n"] else None, "ci_low": ev["ci_low"],
               "ci_high": ev["ci_high"], "expected": run.expected, "seconds": seconds,
               "rl_episodes": record.get("rl", {}).get("episodes", 0), "sft_examples": sft.get("examples", 0)}
        if start is not None:
            row["start"] = {k: start[k] for k in ("successes", "n", "ci_low", "ci_high")}
            if (vs_start := _paired(ev["outcomes"], start["outcomes"], "start")) is not None:
                row["vs_start"] = vs_start
        if first is None:
            first = (run.name, ev["outcomes"])
        elif (vs_first := _paired(ev["outcomes"], first[1], first[0])) is not None:
            row["vs_first"] = vs_first
        rows.append(row)
    return rows


def _paired(outcomes: dict, other: dict, name: str) -> dict | None:
    """Games won by only one of two policies on the same held-out games, with the exact McNemar p-value."""
    if set(outcomes) != set(other):
        return None
    only_this = sum(outcomes[g] and not other[g] for g in outcomes)
    only_other = sum(other[g] and not outcomes[g] for g in outcomes)
    return {"run": name, "only_this": only_this, "only_other": only_other,
            "p_value": mcnemar_exact(only_this, only_other)}


def primary_comparisons(study: Study, results: Results) -> list[dict]:
    """The study's pre-registered comparisons (`Study.primary`), each with its discordant games, exact McNemar p and
    Holm-adjusted p over all of them (`statistics.holm`); a comparison whose runs have not both finished (or are
    stale) has no test and counts with p = 1, so adding runs later cannot make the others look stronger."""
    stale = stale_runs(study, results)

    def outcomes(name: str, of_start: bool = False) -> dict | None:
        record = results.data["runs"].get(name)
        if not record or "eval" not in record or name in stale:
            return None
        if of_start:
            start = results.data.get("start", {}).get(record.get("start") or "")
            return start and start["outcomes"]
        return record["eval"]["outcomes"]

    found = []
    for run, versus in study.primary:
        this = outcomes(run)
        other = outcomes(run, of_start=True) if versus == "start" else outcomes(versus)
        paired = _paired(this, other, versus) if this is not None and other is not None else None
        found.append({**(paired or {"p_value": None}), "run": run, "versus": versus})
    adjusted = holm([1.0 if c["p_value"] is None else c["p_value"] for c in found])
    return [{**c, "holm_p": q if c["p_value"] is not None else None} for c, q in zip(found, adjusted)]


def _primary_lines(primary: list[dict]) -> list[str]:
    if not primary:
        return ["No comparison was named in advance (`primary`): every p-value above is exploratory."]
    lines = [f"Primary comparisons, named in the study file before it ran; p adjusted by Holm's method over all "
             f"{len(primary)} (the p-values in the table above are exploratory, uncorrected):", "",
             "| comparison | +/- | p | Holm p |", "|---|---|---:|---:|"]
    for c in primary:
        name = f"{c['run']} vs {c['versus']}"
        if c["p_value"] is None:
            lines.append(f"| {name} | not run yet (counts as p = 1) | | |")
        else:
            lines.append(f"| {name} | +{c['only_this']}/-{c['only_other']} | {c['p_value']:.3g} | "
                         f"{c['holm_p']:.3g} |")
    return lines


def _percent(value) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) else ("" if value is None else str(value))


def _success(successes: int, n: int, low: float, high: float) -> str:
    return f"{successes}/{n} = {_percent(successes / n if n else None)} ({_percent(low)}-{_percent(high)})"


def _versus(paired: dict | None) -> str:
    return f"+{paired['only_this']}/-{paired['only_other']}, p={paired['p_value']:.3g}" if paired else ""


def markdown_table(study: Study, rows: list[dict], primary: list[dict]) -> str:
    lines = [f"**{study.name}**" + (f": {study.description}" if study.description else ""), ""]
    if study.paper:
        lines += [f"Paper: {study.paper}", ""]
    if study.hardware:
        lines += [f"Sized for: {study.hardware}", ""]
    temperatures = sorted({run.eval.temperature for run in study.runs})
    lines += ["Held-out games played once each at temperature "
              f"{', '.join(f'{t:g}' for t in temperatures)} (0: greedy); 95% CI: Wilson; p: exact McNemar test "
              "on the games both runs played.", ""]
    first = rows[0]["run"] if rows else ""
    lines += [f"| run | changed | SFT examples | RL episodes | start: held-out success | held-out success (95% CI) "
              f"| vs start: +/-, p | paper | vs {first}: +/-, p | wall time |",
              "|---|---|---:|---:|---|---|---|---:|---|---:|"]
    for row in rows:
        changed = ", ".join(f"{k}={short(v)}" for k, v in row["changed"].items()) or "(base)"
        start = row.get("start")
        cells = [row["run"], changed, str(row["sft_examples"]), str(row["rl_episodes"]),
                 _success(start["successes"], start["n"], start["ci_low"], start["ci_high"]) if start else "",
                 _success(row["successes"], row["n"], row["ci_low"], row["ci_high"]),
                 _versus(row.get("vs_start")), _percent(row["expected"]), _versus(row.get("vs_first")),
                 f"{row['seconds'] / 60:.1f} min"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *_primary_lines(primary)]
    return "\n".join(lines) + "\n"


def _bars(ax, xs: list[float], results: list[dict], width: float, color: str, label: str) -> None:
    """Success-rate bars with Wilson 95% intervals as error bars."""
    rates = [r["successes"] / r["n"] if r["n"] else 0.0 for r in results]
    errors = [[rate - r["ci_low"] for rate, r in zip(rates, results)],
              [r["ci_high"] - rate for rate, r in zip(rates, results)]]
    ax.bar(xs, rates, width, yerr=errors, capsize=4, color=color, alpha=0.8, label=f"{label} (95% CI)")


def plot(study: Study, rows: list[dict], path: Path) -> None:
    """Held-out success of each run with its Wilson 95% interval, beside its starting policy's where that was
    played; the paper's number as a marker where given."""
    import matplotlib  # the `plot` extra: only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(rows) + 2), 3.6))
    xs = range(len(rows))
    starts = [(x, row["start"]) for x, row in zip(xs, rows) if row.get("start")]
    width = 0.4 if starts else 0.8
    if starts:
        _bars(ax, [x - width / 2 for x, _ in starts], [start for _, start in starts], width, "tab:gray",
              "starting policy")
    _bars(ax, [x + width / 2 if starts else x for x in xs], rows, width, "tab:blue", "after RL" if starts else
          "held-out success")
    paper = [(x, row["expected"]) for x, row in zip(xs, rows) if isinstance(row["expected"], (int, float))]
    if paper:
        ax.scatter(*zip(*paper), marker="D", color="tab:red", zorder=3, label="paper")
    ax.set_xticks(list(xs), [row["run"] for row in rows], rotation=20, ha="right")
    ax.set(ylim=(0, 1), ylabel="success rate", title=study.name)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(study: Study, results: Results) -> str:
    """Write `<results>.md` (the table), the table into `<results>.json` and the figure `<results>.png`."""
    rows = table_rows(study, results)
    primary = primary_comparisons(study, results)
    table = markdown_table(study, rows, primary)
    results.data["table"] = rows
    results.data["primary"] = primary
    results.save()
    if int(os.environ.get("RANK", "0")) != 0:
        return table
    study.results.with_suffix(".md").write_text(table)
    if rows:
        plot(study, rows, study.results.with_suffix(".png"))
    return table


def observed_discordance(results: Results) -> list[float]:
    """The share of held-out games exactly one policy won, for every paired comparison the results' table holds."""
    rows = results.data.get("table") or []
    return [(pair["only_this"] + pair["only_other"]) / row["n"] for row in rows
            for pair in (row.get("vs_start"), row.get("vs_first")) if pair and row["n"]]


def power_report(study: Study, results: Results, discordance: float | None = None, effects=(0.05, 0.10, 0.15, 0.20),
                 power: float = 0.8, alpha: float = 0.05) -> str:
    """A table of the paired held-out games each effect needs (exact McNemar, `statistics.games_for_power`) and the
    power the study's own game count gives, at the discordance stated or else the mean one its results saw. The level
    is alpha / m for the m pre-registered comparisons (Holm's first step; alpha when none is named)."""
    if discordance is None:
        seen = observed_discordance(results)
        if not seen:
            raise SystemExit(f"{results.path}: no paired results to take the discordance from; give --discordance "
                             "(the share of games exactly one of two policies wins, e.g. 0.25)")
        discordance, source = sum(seen) / len(seen), f"mean of {len(seen)} comparisons in {results.path}"
    else:
        source = "stated"
    comparisons = max(1, len(study.primary))
    games = max((run.data.num_eval_games or 0) for run in study.runs)
    lines = [f"{study.name}: exact McNemar, alpha {alpha} / {comparisons} comparison(s), discordance "
             f"{discordance:.2f} ({source}), target power {power:.0%}", "",
             f"| effect (points) | games needed | power at the study's {games} games |", "|---|---|---|"]
    for effect in effects:
        if effect > discordance:
            lines.append(f"| {effect * 100:.0f} | impossible: above the discordance | |")
            continue
        needed = games_for_power(discordance, effect, power, alpha, comparisons)
        at_study = f"{mcnemar_power(games, discordance, effect, alpha, comparisons):.0%}" if games else ""
        lines.append(f"| {effect * 100:.0f} | {needed if needed is not None else '> 20000'} | {at_study} |")
    return "\n".join(lines)
