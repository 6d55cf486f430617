"""A study runs what its file says: every run's resolved configuration is its own copy (a YAML anchor shared by
several runs cannot carry one run's changes into another), it equals a reader's resolution of the file, and a
report never shows results whose recorded stages are not what the file now resolves to."""

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from trl_multiturn.commands.study import spec as study_module
from trl_multiturn.commands.study.report import stale_runs
from trl_multiturn.commands.study.results import Results
from trl_multiturn.commands.study.spec import load_study

ROOT = Path(__file__).resolve().parents[3]
RECIPES = sorted((ROOT / "recipes" / "paper").glob("*.yaml"))
RESULTS = sorted((ROOT / "benchmarks" / "results" / "paper").glob("*.json"))


def _mutable_ids(value, seen: set[int]) -> set[int]:
    """The ids of every dict, list and dataclass reachable from `value`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        seen.add(id(value))
        for f in dataclasses.fields(value):
            _mutable_ids(getattr(value, f.name), seen)
    elif isinstance(value, dict):
        seen.add(id(value))
        for item in value.values():
            _mutable_ids(item, seen)
    elif isinstance(value, list):
        seen.add(id(value))
        for item in value:
            _mutable_ids(item, seen)
    return seen


def _reader_resolution(path: Path, index: int) -> dict:
    """Run `index` of a study file as a reader resolves it, from a fresh parse of the file (so no object can be
    shared with another run): the base sections, then the sweep's values or the run's `set`, in order, each dotted
    key setting one field."""
    spec = yaml.safe_load(path.read_text())
    base = {key: spec.get(key) for key in study_module.BASE_KEYS}
    for key in ("data", "rl", "eval"):
        base[key] = base[key] or {}
    base["algorithm"] = base["algorithm"] or "none"
    sweep = spec.get("sweep") or {}
    count = len(next(iter(sweep.values()))) if sweep else 0
    changes = ({path: values[index] for path, values in sweep.items()} if index < count
               else spec["runs"][index - count].get("set") or {})
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        target = base
        for key in parents:
            target = target[key]
        target[leaf] = value
    return base


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_no_two_runs_of_a_paper_study_share_a_mutable_object(path):
    runs = load_study(path).runs
    owners: dict[int, str] = {}
    for run in runs:
        for oid in _mutable_ids(run, set()):
            assert oid not in owners, f"{path.name}: runs {owners[oid]!r} and {run.name!r} share an object"
            owners[oid] = run.name


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_run_resolves_to_what_a_reader_of_the_file_expects(path):
    for index, run in enumerate(load_study(path).runs):
        expected = _reader_resolution(path, index)
        assert run.model == expected["model"]
        assert run.algorithm == expected["algorithm"]
        assert run.sft == expected["sft"], run.name
        assert run.rl == expected["rl"], run.name
        data_defaults = dataclasses.asdict(study_module.StudyData())
        assert dataclasses.asdict(run.data) == {**data_defaults, **copy.deepcopy(expected["data"])}, run.name
        assert dataclasses.asdict(run.eval) == {**dataclasses.asdict(study_module.StudyEval()), **expected["eval"]}


def test_a_control_that_changes_an_anchored_section_leaves_the_runs_sharing_the_anchor_alone():
    """The runs the aliasing bug trained wrongly: algorithms_cpu's GRPO took the lr-0 control's learning rate and
    step count, and rewards' RLOO-sparse run took RLOO-dense's reward mode."""
    runs = {run.name: run for run in load_study(ROOT / "recipes/paper/algorithms_cpu.yaml").runs}
    assert (runs["grpo"].rl["learning_rate"], runs["grpo"].rl["max_steps"]) == (2e-5, 8)
    assert (runs["control-lr0"].rl["learning_rate"], runs["control-lr0"].rl["max_steps"]) == (0.0, 1)
    assert runs["grpo"].rl_key() != runs["control-lr0"].rl_key()
    for name in ("rewards.yaml", "rewards_cpu.yaml"):
        runs = {run.name: run for run in load_study(ROOT / "recipes/paper" / name).runs}
        assert runs["rloo-sparse"].rl["reward_mode"] == "sparse"
        assert runs["rloo-dense"].rl["reward_mode"] == "dense_scaled"
        assert runs["rloo-sparse"].rl["advantage_estimator"] == runs["rloo-dense"].rl["advantage_estimator"]


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.stem)
def test_every_committed_study_result_is_what_its_study_file_runs(path):
    study = load_study(ROOT / "recipes" / "paper" / f"{path.stem}.yaml")
    results = Results(path, study.name)
    assert stale_runs(study, results) == {}
    shown = {row["run"] for row in results.data["table"]}
    assert shown == set(results.data["runs"]) - set(results.data.get("withdrawn", {}))


def test_the_grpo_result_recorded_under_the_aliasing_bug_is_withdrawn_with_its_reason():
    data = json.loads((ROOT / "benchmarks/results/paper/algorithms_cpu.json").read_text())
    withdrawn = data["withdrawn"]["grpo"]
    assert withdrawn["settings"]["rl"]["learning_rate"] == 0.0  # what it trained: the control's settings
    assert "RL stage" in withdrawn["withdrawn"]
    assert "grpo" not in data["runs"] and all(row["run"] != "grpo" for row in data["table"])


def _recorded(study_path: Path, outcomes: dict[str, dict] | None = None) -> Path:
    """A results file recording every run of the study as finished, as `run_study` writes it (no training): each
    run's held-out outcomes from `outcomes` (default: one game won of two), and one shared start that won nothing."""
    study = load_study(study_path)
    results = Results(study.results.with_suffix(".json"), study.name)
    games = {"a": True, "b": False}
    start = {"successes": 0, "n": 2, "ci_low": 0.0, "ci_high": 0.5, "seconds": 1.0, "key": "s",
             "outcomes": dict.fromkeys((outcomes or {"": games})[next(iter(outcomes or {"": games}))], False)}
    results.data["start"] = {"s": start}
    for run in study.runs:
        won = (outcomes or {}).get(run.name, games)
        outcome = {"successes": sum(won.values()), "n": len(won), "failed": 0, "ci_low": 0.1, "ci_high": 0.9,
                   "seconds": 1.0, "outcomes": won, "key": "k"}
        results.data["runs"][run.name] = {"fingerprint": run.fingerprint(), "settings": run.settings(),
                                          "changed": run.changed, "expected": None, "eval": outcome, "start": "s",
                                          "rl": {"inputs": run.rl_inputs(), "seconds": 1.0, "episodes": 2}}
    results.save()
    return results.path


def test_report_refuses_results_whose_stages_the_file_no_longer_resolves_to(tmp_path, capsys):
    from trl_multiturn.commands.cli import main

    spec = {"name": "tiny", "output_dir": str(tmp_path / "out"), "results": str(tmp_path / "results" / "tiny"),
            "model": "some-model", "data": {"num_sft_games": 0}, "algorithm": "grpo",
            "rl": {"learning_rate": 1e-3, "max_steps": 2},
            "runs": [{"name": "a"}, {"name": "b", "set": {"rl.max_steps": 3}}]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    results_path = _recorded(path)
    assert main(["study", str(path), "--report"]) == 0
    spec["runs"][1]["set"]["rl.max_steps"] = 4  # run b now means something else than what was recorded
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SystemExit) as refused:
        main(["study", str(path), "--report"])
    assert "b: its settings and its RL stage differ" in str(refused.value) and "a:" not in str(refused.value)
    capsys.readouterr()
    assert main(["study", str(path), "--withdraw-stale"]) == 0
    assert "withdrawn: b" in capsys.readouterr().out
    data = json.loads(results_path.read_text())
    assert set(data["runs"]) == {"a"} and data["withdrawn"]["b"]["settings"]["rl"]["max_steps"] == 3
    assert [row["run"] for row in data["table"]] == ["a"]


def _two_run_study(tmp_path, **extra) -> Path:
    spec = {"name": "tiny", "output_dir": str(tmp_path / "out"), "results": str(tmp_path / "results" / "tiny"),
            "model": "some-model", "data": {"num_sft_games": 0}, "algorithm": "grpo", "rl": {"max_steps": 2},
            "runs": [{"name": "a"}, {"name": "b", "set": {"rl.max_steps": 3}}, {"name": "c"}], **extra}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_report_adjusts_only_the_pre_registered_comparisons_by_holm(tmp_path):
    from trl_multiturn.commands.study.report import write_report
    from trl_multiturn.statistics import mcnemar_exact

    primary = [{"run": "a", "versus": "start"}, {"run": "a", "versus": "b"}, {"run": "c", "versus": "start"}]
    path = _two_run_study(tmp_path, primary=primary)
    games = [f"g{i}" for i in range(20)]
    won = {"a": {g: i < 12 for i, g in enumerate(games)}, "b": {g: i < 4 for i, g in enumerate(games)}}
    _recorded(path, won)
    study = load_study(path)
    results = Results(study.results.with_suffix(".json"), study.name)
    del results.data["runs"]["c"]  # c has not run: its comparison counts with p = 1
    table = write_report(study, results)
    found = {(c["run"], c["versus"]): c for c in results.data["primary"]}
    p_start, p_b = mcnemar_exact(12, 0), mcnemar_exact(8, 0)
    assert found["a", "start"]["p_value"] == pytest.approx(p_start)
    assert found["a", "start"]["holm_p"] == pytest.approx(3 * p_start)  # the smallest of 3, times 3
    assert found["a", "b"]["holm_p"] == pytest.approx(2 * p_b)
    assert found["c", "start"]["p_value"] is None and found["c", "start"]["holm_p"] is None
    assert "over all 3" in table and "c vs start | not run yet" in table and "exploratory" in table


def test_a_study_without_primary_comparisons_says_every_p_value_is_exploratory(tmp_path):
    from trl_multiturn.commands.study.report import write_report

    path = _two_run_study(tmp_path)
    _recorded(path)
    study = load_study(path)
    assert "every p-value above is exploratory" in write_report(study, Results(study.results.with_suffix(".json"),
                                                                                study.name))


@pytest.mark.parametrize("primary", [[{"run": "a", "versus": "nope"}], [{"run": "a"}], [{"run": "a", "versus": "a"}],
                                     [{"run": "a", "versus": "start"}] * 2, ["a"]])
def test_a_primary_comparison_must_name_runs_of_the_study(tmp_path, primary):
    with pytest.raises(ValueError, match="primary"):
        load_study(_two_run_study(tmp_path, primary=primary))
