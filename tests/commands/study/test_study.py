"""The study runner (`trl-multiturn study`): a tiny study end to end with resume, study-file checks, and every
recipe of recipes/paper/ loaded and validated without running it."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from trl_multiturn.commands.study import stages as study_module
from trl_multiturn.commands.study.spec import build_configs, load_study
from trl_multiturn.statistics import wilson_interval

ROOT = Path(__file__).resolve().parents[3]
PAPER = ROOT / "recipes" / "paper"
RECIPES = sorted(PAPER.glob("*.yaml"))


class Stopped(Exception):
    """Stands in for a study stopped by hand (Ctrl-C) or a lost machine."""


def _tiny_study(tmp_path, model, games_dir) -> Path:
    spec = {
        "name": "tiny",
        "description": "two runs that differ in the turn budget",
        "paper": "none: a test",
        "output_dir": str(tmp_path / "out"),
        "results": str(tmp_path / "results" / "tiny"),
        "model": model,
        "data": {"train_shapes": ["w1-o2-q2"], "num_train_games": 2, "num_eval_games": 2, "num_sft_games": 2,
                 "games_dir": str(games_dir)},
        "sft": {"max_steps": 1, "per_device_train_batch_size": 2, "use_cpu": True, "bf16": False,
                "report_to": "none", "save_strategy": "no", "learning_rate": 1e-3},
        "algorithm": "grpo",
        "rl": {"max_turns": 2, "max_completion_length": 4, "num_generations": 2, "per_device_train_batch_size": 2,
               "max_steps": 1, "learning_rate": 1e-3, "use_cpu": True, "bf16": False, "report_to": "none",
               "save_strategy": "no", "logging_steps": 1, "system_prompt": "Reply with one command."},
        "eval": {"temperature": 0.0},
        "sweep": {"rl.max_turns": [1, 2]},
        "expected": [0.25, 0.5],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")
def test_a_tiny_study_runs_end_to_end_and_resumes_where_it_stopped(tiny_chatml_model, textworld_games_dir,
                                                                    tmp_path, monkeypatch, capsys):
    from trl_multiturn.commands.cli import main

    path = _tiny_study(tmp_path, tiny_chatml_model, textworld_games_dir)
    calls = []
    for stage in ("train_sft", "train_rl", "evaluate_run"):
        real = getattr(study_module, stage)

        def recording(*args, _real=real, _stage=stage, **kwargs):
            calls.append(_stage)
            if _stage == "evaluate_run" and fail_next_eval:
                fail_next_eval.pop()
                raise Stopped("stopped during evaluation")
            return _real(*args, **kwargs)

        monkeypatch.setattr(study_module, stage, recording)

    # First sitting: run 1 finishes, run 2 is stopped during its evaluation (after SFT and RL were recorded).
    fail_next_eval = []
    run_one = study_module._run_one
    monkeypatch.setattr(study_module, "_run_one", _stop_second_run(run_one, fail_next_eval))
    with pytest.raises(Stopped):
        main(["study", str(path)])
    monkeypatch.setattr(study_module, "_run_one", run_one)
    # One SFT (shared by both runs: same SFT settings), RL twice, run 1's start and result evaluated, run 2's start
    # evaluation interrupted.
    assert calls == ["train_sft", "train_rl", "evaluate_run", "evaluate_run", "train_rl", "evaluate_run"]
    results = json.loads((tmp_path / "results" / "tiny.json").read_text())
    assert "eval" in results["runs"]["max_turns=1"] and "eval" not in results["runs"]["max_turns=2"]
    assert "rl" in results["runs"]["max_turns=2"] and len(results["sft"]) == 1

    # Second sitting: only run 2's evaluations (its start's and its own) are left.
    calls.clear()
    assert main(["study", str(path)]) == 0
    assert calls == ["evaluate_run", "evaluate_run"]
    results = json.loads((tmp_path / "results" / "tiny.json").read_text())
    rows = results["table"]
    assert [row["run"] for row in rows] == ["max_turns=1", "max_turns=2"]
    for row, record in zip(rows, (results["runs"][r["run"]] for r in rows)):
        ev = record["eval"]
        assert row["n"] == 2 and len(ev["outcomes"]) == 2 and ev["failed"] == 0
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(wilson_interval(row["successes"], row["n"]))
        assert record["settings"]["rl"]["max_turns"] == int(row["run"][-1]) and record["rl"]["steps"] == 1
        assert row["changed"] == {"rl.max_turns": int(row["run"][-1])}
        # The SFT checkpoint RL started from played the same held-out games (one evaluation per turn budget).
        start = results["start"][record["start"]]
        assert row["start"]["n"] == 2 and set(start["outcomes"]) == set(ev["outcomes"])
        assert start["model"] == results["sft"][record["sft"]]["path"] and start["model"] != ev["model"]
        assert row["vs_start"]["run"] == "start" and 0 <= row["vs_start"]["p_value"] <= 1
    assert len(results["start"]) == 2
    assert rows[1]["vs_first"]["run"] == "max_turns=1" and 0 <= rows[1]["vs_first"]["p_value"] <= 1
    table = (tmp_path / "results" / "tiny.md").read_text()
    assert table.count("\n| max_turns=") == 2 and "| 25% |" in table and "| 50% |" in table
    png = (tmp_path / "results" / "tiny.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    # Third sitting: everything recorded, nothing runs; a changed setting reruns only the runs it changes.
    calls.clear()
    assert main(["study", str(path)]) == 0 and calls == []
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = {"rl.max_turns": [1, 3]}
    spec["names"] = ["max_turns=1", "max_turns=2"]
    path.write_text(yaml.safe_dump(spec))
    assert main(["study", str(path)]) == 0
    assert calls == ["train_rl", "evaluate_run", "evaluate_run"]
    assert "settings changed" in capsys.readouterr().out

    # Another study with the same output_dir and a run equal to one above: its SFT and RL checkpoints and both
    # held-out results are reused from their saved records; nothing is trained or played.
    spec.update(name="other", results=str(tmp_path / "results" / "other"), sweep={"rl.max_turns": [3]}, expected=None)
    spec.pop("names")
    path.write_text(yaml.safe_dump(spec))
    calls.clear()
    assert main(["study", str(path)]) == 0 and calls == []
    first = json.loads((tmp_path / "results" / "tiny.json").read_text())
    other = json.loads((tmp_path / "results" / "other.json").read_text())
    assert other["runs"]["max_turns=3"]["rl"] == first["runs"]["max_turns=2"]["rl"]
    assert other["runs"]["max_turns=3"]["eval"] == first["runs"]["max_turns=2"]["eval"]
    assert other["start"] == {key: first["start"][key] for key in other["start"]}
    assert Path(first["runs"]["max_turns=2"]["rl"]["path"]).name.startswith("grpo-")
    # Other held-out games: the same checkpoints play them (the start, then the trained policy).
    spec["data"]["num_eval_games"] = 1
    path.write_text(yaml.safe_dump(spec))
    assert main(["study", str(path)]) == 0 and calls == ["evaluate_run", "evaluate_run"]
    other = json.loads((tmp_path / "results" / "other.json").read_text())["runs"]["max_turns=3"]
    assert other["eval"]["n"] == 1 and other["eval"]["model"] == first["runs"]["max_turns=2"]["rl"]["path"]


def _stop_second_run(run_one, fail_next_eval):
    def wrapped(study, run, *args, **kwargs):
        if run.name == "max_turns=2":
            fail_next_eval.append(True)
        return run_one(study, run, *args, **kwargs)

    return wrapped


def test_runs_share_an_sft_checkpoint_only_when_every_sft_input_is_equal(tmp_path, textworld_games_dir):
    run = load_study(_tiny_study(tmp_path, "some-model", textworld_games_dir)).runs[0]

    def key(model=None, sft=None, rl=None, data=None, **fields):
        return dataclasses.replace(run, model=model or run.model, sft={**run.sft, **(sft or {})},
                                   rl={**run.rl, **(rl or {})}, data=dataclasses.replace(run.data, **(data or {})),
                                   **fields).sft_key()

    # What only RL or the held-out games read does not retrain SFT ...
    shared = [key(rl={"max_turns": 7}), key(rl={"learning_rate": 0.5, "num_generations": 4}),
              key(algorithm="ppo"), key(eval=dataclasses.replace(run.eval, temperature=0.4)),
              key(data={"num_train_games": 9, "num_eval_games": 50, "eval_shapes": ["w4-o6-q8"]})]
    assert set(shared) == {run.sft_key()}
    # ... while every SFT input does: the model, the SFT config, the episode format it copies from `rl`, the SFT
    # games and how their walkthroughs are written.
    changed = [key(model="other-model"), key(sft={"learning_rate": 0.5}), key(sft={"max_steps": 2}),
               key(rl={"system_prompt": "Play."}), key(rl={"action_parser": "whole_reply"}),
               key(data={"num_sft_games": 3}), key(data={"sft_first_game": 600_000}),
               key(data={"train_shapes": ["w2-o3-q4"]}), key(data={"challenge_goal": "brief"}),
               key(data={"admissible_commands": True})]
    assert run.sft_key() not in changed and len(set(changed)) == len(changed)
    assert key(sft={"system_prompt": "Play."}) == key(rl={"system_prompt": "Play."})  # SFT's own wins either way


def test_runs_share_an_rl_checkpoint_only_when_every_rl_input_is_equal(tmp_path, textworld_games_dir):
    run = load_study(_tiny_study(tmp_path, "some-model", textworld_games_dir)).runs[0]

    def key(sft=None, rl=None, data=None, **fields):
        return dataclasses.replace(run, sft={**run.sft, **(sft or {})}, rl={**run.rl, **(rl or {})},
                                   data=dataclasses.replace(run.data, **(data or {})), **fields).rl_key()

    # What only the held-out games read does not retrain RL ...
    shared = [key(eval=dataclasses.replace(run.eval, temperature=0.4, max_turns=9)),
              key(data={"num_eval_games": 50, "eval_shapes": ["w4-o6-q8"]}), key(expected=0.9, name="other")]
    assert set(shared) == {run.rl_key()}
    # ... while its start, the algorithm and its config and the training games do.
    changed = [key(sft={"learning_rate": 0.5}), key(model="other-model"), key(rl={"max_turns": 7}),
               key(algorithm="rloo"), key(data={"num_train_games": 9}), key(data={"train_shapes": ["w2-o3-q4"]})]
    assert run.rl_key() not in changed and len(set(changed)) == len(changed)
    assert dataclasses.replace(run, algorithm="none").rl_key() is None
    assert run.stage_dirs(tmp_path) == (tmp_path / f"sft-{run.sft_key()}", tmp_path / f"grpo-{run.rl_key()}")


@pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")
def test_a_sweep_trains_sft_once_and_a_changed_sft_field_trains_it_again(tiny_chatml_model, textworld_games_dir,
                                                                        tmp_path, monkeypatch):
    from trl_multiturn.commands.cli import main

    path = _tiny_study(tmp_path, tiny_chatml_model, textworld_games_dir)
    spec = yaml.safe_load(path.read_text())
    spec.update(algorithm="none", sweep={"rl.max_turns": [1, 2]}, expected=None,
                runs=[{"name": "sft-lr", "set": {"sft.learning_rate": 1e-2}}])
    spec["data"]["num_eval_games"] = 1
    path.write_text(yaml.safe_dump(spec))
    trained = []
    real = study_module.train_sft
    monkeypatch.setattr(study_module, "train_sft", lambda config, *a: trained.append(config.output_dir)
                        or real(config, *a))
    assert main(["study", str(path)]) == 0
    results = json.loads((tmp_path / "results" / "tiny.json").read_text())
    keys = [results["runs"][name]["sft"] for name in ("max_turns=1", "max_turns=2", "sft-lr")]
    assert keys[0] == keys[1] != keys[2] and len(trained) == 2 and sorted(results["sft"]) == sorted(set(keys))
    assert trained == [str(tmp_path / "out" / f"sft-{keys[0]}"), str(tmp_path / "out" / f"sft-{keys[2]}")]
    assert results["sft"][keys[2]]["inputs"]["sft"]["learning_rate"] == 1e-2
    # Every run was evaluated from its SFT checkpoint (no RL), and a second sitting trains nothing.
    assert [results["runs"][n]["eval"]["model"] for n in ("max_turns=1", "sft-lr")] == trained
    assert main(["study", str(path)]) == 0 and len(trained) == 2


def test_study_files_are_checked_before_anything_runs(tmp_path, textworld_games_dir):
    path = _tiny_study(tmp_path, "some-model", textworld_games_dir)
    spec = yaml.safe_load(path.read_text())

    def refused(change, match):
        bad = json.loads(json.dumps(spec))
        change(bad)
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(ValueError, match=match):
            load_study(path)

    refused(lambda s: s["rl"].update(max_turn=3), r"\['max_turn'\] are not fields of MultiTurnGRPOConfig")
    refused(lambda s: s["sft"].update(max_turns=3), r"\['max_turns'\] are not fields of MultiTurnSFTConfig")
    refused(lambda s: s["data"].update(sft_first_game=1), "SFT games overlap the RL games")
    refused(lambda s: s["data"].update(train_shapes=["2-3-4"]), "w<rooms>-o<objects>-q<quest length>")
    refused(lambda s: s.update(algorithm="a2c"), "algorithm='a2c'")
    refused(lambda s: s["rl"].update(output_dir="x"), "set by the study runner")
    refused(lambda s: s.update(sweep={"rl.max_turns": [1, 2], "rl.max_steps": [1]}), "same number of values")
    refused(lambda s: s.update(sweep={"rl.max_turns": [1, 1]}), "distinct names")


def test_paper_recipes_come_in_gpu_and_cpu_scale_for_every_study():
    names = {p.stem for p in RECIPES}
    studies = {name.removesuffix("_cpu") for name in names}
    assert studies >= {"complexity", "model_size", "exploration_budget", "transfer", "mixed_complexity", "rewards",
                       "algorithms", "sft_rl_ratio"}
    assert names == studies | {f"{name}_cpu" for name in studies}


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_paper_recipe_loads_and_builds_its_configs(path, tmp_path):
    study = load_study(path)
    spec = yaml.safe_load(path.read_text())
    assert study.paper and study.hardware and len(study.runs) >= 2
    cpu = path.stem.endswith("_cpu")
    assert (spec["model"] == "offline:smollm2-135m-instruct") == cpu  # runs may change it (model_size)
    for run in study.runs:
        if not cpu:  # paper hyperparameters; the GPU settings are swapped for CPU ones only to build the configs here
            assert spec["rl"]["temperature"] == 0.7 and run.eval.temperature == 0.4
            assert run.data.num_eval_games == 100
            run = dataclasses.replace(run, rl={**run.rl, "bf16": False, "use_cpu": True, "use_vllm": False},
                                      sft=None if run.sft is None else {**run.sft, "bf16": False, "use_cpu": True})
        sft, rl, episode = build_configs(run, tmp_path / run.name)
        if rl is not None:
            rl.check_multiturn_args()
        if sft is not None:
            assert sft.system_prompt == episode.system_prompt and sft.action_parser == episode.action_parser
        assert math.isfinite(run.eval.temperature) and episode.max_turns >= 1


def test_a_study_waits_for_another_training_the_same_stage_and_reuses_it(tmp_path):
    import threading

    path = tmp_path / "ppo-abc"
    started, release, logs, trained = threading.Event(), threading.Event(), [], []

    def train(name):
        def run():
            trained.append(name)
            started.set()
            release.wait(10)
            path.mkdir()
            (path / "config.json").write_text("{}")
            return {"path": str(path), "seconds": 1.0}
        return run

    first = threading.Thread(target=lambda: study_module._stage("first", None, path, {"k": 1}, logs.append,
                                                                train("first")))
    first.start()
    assert started.wait(10)
    second_result = []
    second = threading.Thread(target=lambda: second_result.append(
        study_module._stage("second", None, path, {"k": 1}, logs.append, train("second"))))
    second.start()
    for _ in range(100):  # the second study reports that it waits, and does not train
        if any(line.startswith("second: waiting") for line in logs):
            break
        threading.Event().wait(0.05)
    assert any(line.startswith("second: waiting") for line in logs) and trained == ["first"]
    release.set()
    first.join(10)
    second.join(10)
    assert trained == ["first"] and second_result[0] == {"path": str(path), "seconds": 1.0, "inputs": {"k": 1}}
    assert json.loads((path / "stage.json").read_text()) == second_result[0]
