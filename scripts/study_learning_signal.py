"""The registered test of docs/study_learning_signal.md: each arm against SFT on walkthroughs on the same held-out
games, exact McNemar on the paired per-game outcomes, Holm over the three comparisons.

    python scripts/study_learning_signal.py outputs/study_ls

reads `<dir>/<arm>/eval_results.json` (what each arm's training command writes after its held-out evaluation) for the
baseline `sft` and the arms `dagger`, `grpo_ds` and `distill`, refuses arms that did not play the same games, and
prints one line per comparison: success of both, +only_arm/-only_sft games, the McNemar p and its Holm adjustment.
"""

import argparse
import json
from pathlib import Path

from trl_multiturn.statistics import holm, paired_test

BASELINE = "sft"
ARMS = ("dagger", "grpo_ds", "distill")


def outcomes(folder: Path) -> dict[str, bool]:
    """Won or not per held-out game (keyed by its task row), failed episodes left out."""
    record = json.loads((folder / "eval_results.json").read_text())
    return {json.dumps(o["task"], sort_keys=True): bool(o["won"]) for o in record["outcomes"] if not o["failed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study_dir", type=Path, help="folder holding sft/, dagger/, grpo_ds/, distill/")
    study_dir = parser.parse_args().study_dir
    baseline = outcomes(study_dir / BASELINE)
    results = {arm: outcomes(study_dir / arm) for arm in ARMS}
    for arm, won in results.items():
        if won.keys() != baseline.keys():
            raise SystemExit(f"{arm} and {BASELINE} did not play (or finish) the same held-out games: "
                             f"{len(won.keys() ^ baseline.keys())} differ; rerun the evaluation of both")
    tests = {arm: paired_test(won, baseline) for arm, won in results.items()}
    adjusted = holm([test.p_value for test in tests.values()])
    games = len(baseline)
    print(f"{BASELINE}: {sum(baseline.values())}/{games}")
    for (arm, test), q in zip(tests.items(), adjusted):
        print(f"{arm} vs {BASELINE}: {sum(results[arm].values())}/{games} against {sum(baseline.values())}/{games}, "
              f"{test}, Holm-adjusted p = {q:.3g}")


if __name__ == "__main__":
    main()
