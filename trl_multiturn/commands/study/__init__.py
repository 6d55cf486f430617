"""`trl-multiturn study recipes/paper/<study>.yaml`: one of the paper's experiments as a sweep of SFT -> RL ->
held-out evaluation runs, resumable, ending in one results table (Markdown and JSON, Wilson 95% intervals) and one
figure.

A study file names a base pipeline and the runs that change it:

    name: exploration_budget                 # the study; results go to `results` (.json, .md, .png)
    paper: "Table 4: ..."                    # what the paper measured (free text, printed with the table)
    hardware: "8x H100 80GB"                 # what the recipe is sized for (free text)
    model: Qwen/Qwen2.5-1.5B-Instruct        # the starting policy (a Hub id, a path, offline:smollm2-135m-instruct)
    data: {...}                              # StudyData: environment, training shapes / task types / SWE-Gym tiers
    sft: {...}                               # MultiTurnSFTConfig fields of an SFT warm start, or null for none
    algorithm: ppo                           # grpo, rloo, ppo, or none (pure SFT)
    rl: {...}                                # the algorithm's config fields (MultiTurnPPOConfig here)
    eval: {...}                              # StudyEval: temperature, turns of the held-out episodes
    sweep:                                   # runs made by changing fields together (dotted paths), or ...
      rl.max_turns: [6, 8, 12, 16]
      eval.max_turns: [6, 8, 12, 16]
    expected: [0.55, 0.73, 0.75, 0.76]       # optional: the paper's number for each run
    runs:                                    # ... runs listed one by one (both may be given; sweep runs first)
      - {name: sparse, set: {rl.reward_mode: sparse}, expected: 0.5}
      - {name: rloo, set: {algorithm: rloo, rl: *rloo}}   # a whole section replaced (anchor in a "_" key)
    primary:                                 # optional: the comparisons the study is for, named before it runs
      - {run: sparse, versus: start}         # a run against its own SFT start, or against another run

Each run trains an SFT warm start (when `sft` is set), then RL from it on the training games, then plays the held-
out games once with its starting policy and once with the trained one, recording each game's outcome. Every
checkpoint is named by a digest of everything it depends on (`<output_dir>/sft-<key>`, `<output_dir>/<algorithm>-
<key>`, output_dir defaulting to `outputs/paper` for every study) and saved with its record (`stage.json`): runs of
any study whose inputs are equal share it, so a stage trained by one study is reused by the next; held-out results
likewise (`<output_dir>/evals/<key>.json`). The results JSON is rewritten after every stage: running the study again
skips what is recorded (a finished run, or the SFT and RL stages of a run that stopped during evaluation) as long as
the run's settings are unchanged. A study that needs a stage another study is training waits for it (a lock file
beside the checkpoint; not under `accelerate launch`).

The report adjusts the `primary` comparisons' p-values by Holm's method over all of them (one not yet run counts
with p = 1) and marks every other p-value exploratory: a comparison added after looking at the results is not one
the study was for.

The package: `spec.py` (the file's schema and resolution), `stages.py` (running: stage cache, lock, training,
held-out evaluations), `results.py` (the results JSON), `report.py` (tables, tests, figure, power); this module
holds the command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ...model_setup import set_cpu_threads
from ..recipes import resolve_config


def _study_command(args: argparse.Namespace) -> int:
    # Imported when the command runs: they load the trainers (torch), which the CLI's other commands do not need.
    from .report import markdown_table, power_report, stale_runs, withdraw_stale, write_report
    from .results import Results
    from .spec import load_study
    from .stages import run_study

    study = load_study(args.study)
    if args.check:
        print(f"{args.study}: {len(study.runs)} runs, fields valid: {', '.join(run.name for run in study.runs)}")
        return 0
    if args.power:
        results = Results(study.results.with_suffix(".json"), study.name)
        print(power_report(study, results, args.discordance, power=args.target_power))
        return 0
    if args.report or args.withdraw_stale:
        results = Results(study.results.with_suffix(".json"), study.name)
        if args.withdraw_stale:
            for name, reason in withdraw_stale(study, results).items():
                print(f"withdrawn: {name}: {reason}")
        stale = stale_runs(study, results)
        if stale:
            runs = "; ".join(f"{name}: {reason}" for name, reason in stale.items())
            raise SystemExit(f"{results.path}: results that are not what {args.study} now runs ({runs}). Run them "
                             f"again (--runs {' '.join(stale)}) or move them aside with --withdraw-stale")
        print(write_report(study, results))
        return 0
    unknown = sorted(set(args.runs or []) - {run.name for run in study.runs})
    if unknown:
        raise SystemExit(f"--runs: {unknown} are not runs of {study.name}")
    import torch

    if not torch.cuda.is_available():
        set_cpu_threads(args.cpu_threads)
    results = run_study(study, args.runs)
    print(markdown_table(study, results.data["table"], results.data["primary"]))
    return 0


def add_study_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "study", help="Run one of the paper's studies (recipes/paper/): SFT -> RL -> held-out evaluation per run.",
        description="trl-multiturn study recipes/paper/<study>.yaml: runs in order, skips the runs (and stages) the "
                    "results JSON records, writes the table (.md, .json) and figure (.png).",
    )
    parser.add_argument("study", type=lambda text: Path(resolve_config(text)),
                        help="The study file, or a shipped study's name (e.g. paper/algorithms_cpu).")
    parser.add_argument("--runs", nargs="+", help="Only these runs (default: all, in order).")
    parser.add_argument("--check", action="store_true", help="Validate the study file and exit.")
    parser.add_argument("--report", action="store_true",
                        help="Rewrite the table and figure from the results; refused while any recorded run is "
                             "not what the study file now resolves to.")
    parser.add_argument("--withdraw-stale", action="store_true",
                        help="Move the records of runs that are not what the study file now resolves to into the "
                             "results' `withdrawn` section (kept, never shown), then rewrite the report.")
    parser.add_argument("--power", action="store_true",
                        help="Print the paired held-out games needed to detect 5-20 point effects (exact McNemar, "
                             "corrected for the file's primary comparisons) and the power of the study's own count.")
    parser.add_argument("--discordance", type=_unit_interval,
                        help="With --power: the share of games exactly one of two policies wins (default: the mean "
                             "its results saw).")
    parser.add_argument("--target-power", type=_unit_interval, default=0.8, help="With --power: default 0.8.")
    parser.add_argument("--cpu-threads", type=_positive, metavar="N",
                        help="PyTorch threads on a machine without a GPU (default: the cores this process may use, "
                             "never more than OMP_NUM_THREADS when it is set).")
    parser.set_defaults(func=_study_command)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of threads, at least 1")
    return int(text)


def _unit_interval(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number strictly between 0 and 1")
    return value
