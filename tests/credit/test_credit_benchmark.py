"""benchmarks/credit_assignment.py's step-wise arms: the history each run trains with is the one its greedy
evaluation plays, and a history without the step-wise format is refused."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import trl_multiturn.evaluation

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "credit_assignment.py"


@pytest.fixture(scope="module")
def benchmark():
    name = "benchmarks_credit_assignment"
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]


def test_histories_name_the_stepwise_arms_and_are_refused_with_trajectories(benchmark):
    assert benchmark.histories_to_run("trajectory", None) == [None]
    assert benchmark.histories_to_run("stepwise", None) == ["full"]
    assert benchmark.histories_to_run("stepwise", ["window:2", "full"]) == ["window:2", "full"]
    with pytest.raises(SystemExit):
        benchmark.main(["--history", "window:2"])  # trajectory format: argparse's error, before any run
    assert benchmark.arm_label("gigpo", history="window:2") == "gigpo stepwise window:2"
    assert benchmark.arm_label("gigpo") == "gigpo"


@pytest.mark.parametrize("history", [None, "window:2"])
def test_greedy_evaluation_plays_the_history_the_run_trains_with(benchmark, monkeypatch, tmp_path, history):
    """The evaluation is replaced by a recorder reporting success 1.0, so the run stops before training: what is
    checked is the config the trainer was built with, as its rules of play read it, reaching `evaluate`."""
    played = []

    def recorder(*args, **kwargs):
        rules = kwargs["rules"]
        played.append(rules.history if rules.episode_format == "stepwise" else None)
        return SimpleNamespace(success_rate=1.0)

    monkeypatch.setattr(trl_multiturn.evaluation, "evaluate", recorder)
    result = benchmark.run("gigpo", "sparse", 0, max_steps=1, eval_every=1, num_generations=2, learning_rate=1e-3,
                           target=0.9, hidden_size=16, max_turns=4, turn_gamma=1.0, rloo_trainer=False,
                           workdir=str(tmp_path), history=history)
    assert played == [history] and result.episodes == 0
