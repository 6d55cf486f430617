"""The statistics every evaluation report uses: Wilson intervals, the exact McNemar test, Holm, power, and a
recipe's effect across seeds."""

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from trl_multiturn.commands.study.spec import load_study
from trl_multiturn.evaluation import EvalResult
from trl_multiturn.rollout import Episode
from trl_multiturn.statistics import (
    games_for_power,
    holm,
    mcnemar_exact,
    mcnemar_power,
    paired_test,
    seed_effect,
    sign_flip_p,
    wilson_interval,
)

ROOT = Path(__file__).resolve().parents[1]


def test_wilson_interval_matches_hand_computed_values():
    # 8/10 at z=1.96: centre (0.8 + 0.19208) / 1.38416, half 1.96 * sqrt(0.016 + 0.0009604) / 1.38416
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_mcnemar_exact_is_the_two_sided_binomial_tail_of_the_disagreements():
    # 10 disagreements split 9:1 -> p = 2 * (C(10,0) + C(10,1)) / 1024 = 22/1024
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert mcnemar_exact(1, 9) == mcnemar_exact(9, 1)
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0
    # brute force over every outcome of n fair coins: P(|heads - tails| >= observed)
    for a, b in [(7, 2), (3, 12), (4, 4), (0, 1)]:
        n = a + b
        extreme = sum(math.comb(n, i) for i in range(n + 1) if abs(2 * i - n) >= abs(a - b))
        assert mcnemar_exact(a, b) == pytest.approx(min(1.0, extreme / 2 ** n))


def test_paired_test_counts_disagreements_on_shared_tasks_only():
    a = {"g1": True, "g2": True, "g3": False, "g4": True, "only_in_a": True}
    b = {"g1": True, "g2": False, "g3": False, "g4": False, "only_in_b": True}
    result = paired_test(a, b)
    assert (result.only_a, result.only_b) == (2, 0)
    assert result.p_value == pytest.approx(mcnemar_exact(2, 0))
    assert paired_test(b, a).only_b == 2


def test_eval_result_won_by_task_pairs_episodes_by_task_and_skip_failed_ones():
    def episode(seed, won, failed=False):
        ep = Episode(task={"seed": seed, "game": "g"}, prompt_ids=[], prompt_messages=[])
        if failed:
            ep.fail("the engine crashed")
        else:
            ep.end(won)
        return ep

    result = EvalResult(1, 2, 0.0, 1.0, 1.0, 1, [episode(1, True), episode(2, False), episode(3, True, failed=True)])
    outcomes = result.won_by_task()
    assert sorted(outcomes.values()) == [False, True] and len(outcomes) == 2
    assert outcomes['{"game": "g", "seed": 1}'] is True


def test_holm_multiplies_the_ith_smallest_p_by_m_minus_i_plus_one_and_keeps_the_order_monotone():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> raised to 0.06 (step-down)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == [0.02] and holm([]) == []


def test_mcnemar_power_is_what_simulated_studies_of_the_exact_test_reject():
    """`mcnemar_power` against a simulation of the very test it describes: paired games, each discordant with
    probability d, the better policy winning a discordant one with probability 1/2 + delta / (2 d)."""
    import random

    rng = random.Random(0)
    for games, discordance, effect, comparisons in ((100, 0.25, 0.10, 1), (60, 0.3, 0.15, 4), (150, 0.14, 0.0, 1)):
        pi = 0.5 + effect / (2 * discordance)
        trials, rejected = 3000, 0
        for _ in range(trials):
            discordant = sum(rng.random() < discordance for _ in range(games))
            only_a = sum(rng.random() < pi for _ in range(discordant))
            rejected += mcnemar_exact(only_a, discordant - only_a) <= 0.05 / comparisons
        exact = mcnemar_power(games, discordance, effect, comparisons=comparisons)
        assert abs(rejected / trials - exact) < 4 * (exact * (1 - exact) / trials) ** 0.5 + 0.005
    assert mcnemar_power(150, 0.14, 0.0) <= 0.05  # no effect: the exact test's size, never above alpha


def test_games_needed_grow_with_corrections_and_shrink_with_the_effect():
    # The issue's own sizing: a 10-point effect at 25% discordance under Holm over 4 comparisons needs ~290 games.
    needed = games_for_power(0.25, 0.10, comparisons=4)
    assert 270 <= needed <= 310
    assert mcnemar_power(needed, 0.25, 0.10, comparisons=4) >= 0.8
    assert games_for_power(0.25, 0.10) < needed < games_for_power(0.25, 0.05, comparisons=4)
    with pytest.raises(ValueError, match="effect=0.3"):
        mcnemar_power(100, 0.25, 0.3)


def test_power_report_takes_the_discordance_from_the_results_and_corrects_for_the_primaries(tmp_path):
    from trl_multiturn.commands.study.report import observed_discordance, power_report
    from trl_multiturn.commands.study.results import Results

    study = load_study(Path("recipes/paper/algorithms_cpu.yaml"))
    results = Results(Path("benchmarks/results/paper/algorithms_cpu.json"), study.name)
    seen = observed_discordance(results)
    assert seen and all(0 < d < 1 for d in seen)
    report = power_report(study, results)
    assert f"discordance {sum(seen) / len(seen):.2f}" in report and "/ 1 comparison" in report
    stated = power_report(dataclasses.replace(study, primary=[("ppo", "start")] * 3), results, discordance=0.25)
    assert "/ 3 comparison" in stated and "(stated)" in stated
    empty = Results(tmp_path / "none.json", study.name)
    with pytest.raises(SystemExit, match="--discordance"):
        power_report(study, empty)


def _t_cdf_by_integration(t: float, df: int, steps: int = 20000) -> float:
    """P(T <= t) by Simpson's rule over Student's density from 0 to |t| (an independent check of the closed form)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    h = abs(t) / steps
    total = sum((1 if k in (0, steps) else 4 if k % 2 else 2) * c * (1 + (k * h) ** 2 / df) ** (-(df + 1) / 2)
                for k in range(steps + 1)) * h / 3
    return 0.5 + math.copysign(total, t)


def test_sign_flip_p_counts_the_sign_vectors_at_least_as_extreme():
    assert sign_flip_p([1, 2, 3, 4]) == 2 / 16  # only all-plus and all-minus reach |sum| = 10
    assert sign_flip_p([0.05, 0.05, 0.05]) == 2 / 8
    assert sign_flip_p([1, -1]) == 1.0
    # [3, 1, -1]: |sum| = 3 is reached by the 4 vectors whose sign on 3 agrees with the other two's sum or beats it
    assert sign_flip_p([3, 1, -1]) == sum(abs(3 * a + b - c) >= 3 for a in (-1, 1) for b in (-1, 1)
                                          for c in (-1, 1)) / 8


def test_seed_effect_is_the_mean_difference_with_its_t_interval_and_tests():
    effect = seed_effect([0.07, 0.13, 0.12, 0.04])
    assert effect.n == 4 and effect.mean == pytest.approx(0.09)
    assert effect.sd == pytest.approx(math.sqrt((0.02 ** 2 + 0.04 ** 2 + 0.03 ** 2 + 0.05 ** 2) / 3))
    half = 3.18245 * effect.sd / 2  # t_{0.975, 3} * sd / sqrt(4)
    assert (effect.ci_low, effect.ci_high) == pytest.approx((0.09 - half, 0.09 + half), abs=1e-5)
    t = 0.09 / (effect.sd / 2)
    assert effect.t_p == pytest.approx(2 * (1 - _t_cdf_by_integration(t, 3)), abs=1e-6)
    assert effect.sign_flip_p == 2 / 16
    assert seed_effect([0.02, -0.02]).t_p == pytest.approx(1.0) and seed_effect([0.1, 0.1]).t_p == 0.0
    with pytest.raises(ValueError, match="at least 2 seeds"):
        seed_effect([0.1])


def _learning_benchmark(monkeypatch):
    spec = importlib.util.spec_from_file_location("learning_benchmark", ROOT / "benchmarks" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _results_file(path, seed, evals):
    """A learning-benchmark results file with `evals` {name: per-game outcomes} (keys "0", "1", ...)."""
    path.write_text(json.dumps({"setting": {"seed": seed}, "eval": {
        name: {"successes": sum(won), "n": len(won), "outcomes": {str(g): w for g, w in enumerate(won)}}
        for name, won in evals.items()}}))
    return str(path)


def test_the_learning_benchmarks_seed_report_pairs_each_run_with_its_baseline(tmp_path, monkeypatch):
    learning = _learning_benchmark(monkeypatch)
    start = [True] * 5 + [False] * 5
    a = _results_file(tmp_path / "a.json", 1, {"sft": start, "grpo": [True] * 7 + [False] * 3})
    b = _results_file(tmp_path / "b.json", 2, {"sft": start, "other": [True] * 6 + [False] * 4})
    table = learning.seeds_report([a, f"{b}:other"], "grpo", ["sft"])
    assert "| 7/10 | 5/10 | +20.0% | +2/-0, p=0.5 |" in table and "| 6/10 | 5/10 | +10.0% | +1/-0, p=1 |" in table
    assert "mean difference +15.0%" in table and "exact sign-flip p = 0.5" in table
    with pytest.raises(SystemExit, match="no evaluation"):
        learning.seeds_report([a, b], "grpo", ["sft"])  # b's run is named "other", not "grpo"
    c = _results_file(tmp_path / "c.json", 3, {"sft": start + [True], "grpo": start + [True]})
    with pytest.raises(SystemExit, match="different held-out games"):
        learning.seeds_report([a, c], "grpo", ["sft"])


def test_the_learning_benchmarks_seed_report_adjusts_several_baselines_as_one_family(tmp_path, monkeypatch):
    learning = _learning_benchmark(monkeypatch)
    start, weak = [True] * 5 + [False] * 5, [True] * 2 + [False] * 8
    runs = [_results_file(tmp_path / f"{seed}.json", seed, {"sft": start, "rs": weak, "grpo": won})
            for seed, won in ((1, [True] * 7 + [False] * 3), (2, [True] * 6 + [False] * 4),
                              (3, [True] * 8 + [False] * 2))]
    table = learning.seeds_report(runs, "grpo", ["sft", "rs"])
    assert "### grpo vs sft" in table and "### grpo vs rs" in table
    p_sft = seed_effect([0.2, 0.1, 0.3]).t_p
    p_rs = seed_effect([0.5, 0.4, 0.6]).t_p
    q_sft, q_rs = holm([p_sft, p_rs])
    assert q_rs == 2 * p_rs and q_sft == max(p_sft, q_rs)  # the step-down order: the smaller p is tested first
    assert f"vs sft: {p_sft:.3g} -> {q_sft:.3g}; vs rs: {p_rs:.3g} -> {q_rs:.3g}." in table
    with pytest.raises(SystemExit, match="'sft_rs' there"):
        learning.seeds_report(runs, "grpo", ["sft", "sft_rs"])


def test_the_learning_benchmarks_seed_report_compares_with_models_in_other_files(tmp_path, monkeypatch):
    """`--against`: the same arm at another setting (e.g. another turn budget) lives in a results file of its own;
    each run is paired with the matching file's model, game by game, and joins the baselines' Holm family."""
    learning = _learning_benchmark(monkeypatch)
    start = [True] * 5 + [False] * 5
    runs = [_results_file(tmp_path / f"long{seed}.json", seed,
                          {"sft": start, "ppo": [True] * (6 + seed) + [False] * (4 - seed)}) for seed in (1, 2, 3)]
    short = [_results_file(tmp_path / f"short{seed}.json", seed, {"ppo": [False] * 2 + [True] * 4 + [False] * 4})
             for seed in (1, 2, 3)]
    table = learning.seeds_report(runs, "ppo", ["sft"], [["6-turns", *short]])
    # seed 1: 7/10 against 4/10; games 0-1 won only by the long run, 6 only by the long run: +3/-0
    assert "| 7/10 | 4/10 | +30.0% | +3/-0, p=0.25 |" in table and "### ppo vs 6-turns" in table
    q_sft, q_short = holm([seed_effect([0.2, 0.3, 0.4]).t_p, seed_effect([0.3, 0.4, 0.5]).t_p])
    assert f"-> {q_sft:.3g}; vs 6-turns:" in table and table.endswith(f"-> {q_short:.3g}.")
    alone = learning.seeds_report(runs, "ppo", [], [["6-turns", *short]])
    assert "Holm" not in alone and "mean difference +40.0%" in alone
    with pytest.raises(SystemExit, match="2 files for 3 runs"):
        learning.seeds_report(runs, "ppo", [], [["6-turns", *short[:2]]])
    with pytest.raises(SystemExit, match="names another comparison"):
        learning.seeds_report(runs, "ppo", ["sft"], [["sft", *short]])
    with pytest.raises(SystemExit, match=r"short1.json:grpo: no evaluation of '6-turns'"):
        learning.seeds_report(runs, "ppo", [], [["6-turns", f"{short[0]}:grpo", *short[1:]]])
    other = _results_file(tmp_path / "other.json", 1, {"ppo": [True] * 11})
    with pytest.raises(SystemExit, match="different held-out games"):
        learning.seeds_report(runs, "ppo", [], [["6-turns", other, *short[1:]]])


def test_the_learning_benchmarks_results_file_keeps_what_parallel_processes_wrote(tmp_path, monkeypatch):
    """Two eval stages on one results file (e.g. one evaluating finished arms while another arm trains): each
    writes its own models' entries, never its stale copy of the whole section."""
    learning = _learning_benchmark(monkeypatch)
    path = tmp_path / "seed1.json"
    first, second = learning.Results(path), learning.Results(path)  # both loaded before either writes
    first.put("eval", {"successes": 1}, entry="rloo")
    second.put("eval", {"successes": 2}, entry="ppo")
    second.put("ppo", {"steps": 50})
    assert learning.Results(path).data == {"eval": {"rloo": {"successes": 1}, "ppo": {"successes": 2}},
                                           "ppo": {"steps": 50}}
    assert "rloo" in second.data["eval"] and first.reload()["ppo"] == {"steps": 50}


def test_the_learning_benchmarks_rl_arms_differ_only_in_their_algorithm(tmp_path, monkeypatch):
    learning = _learning_benchmark(monkeypatch)
    setting = learning.Setting(rl_episodes=400)
    built = {arm: learning.rl_config(arm, setting, tmp_path / arm) for arm in learning.RL_ARMS}
    estimators = {arm: (cls.__name__, config.advantage_estimator) for arm, (cls, config) in built.items()}
    assert estimators == {"grpo": ("MultiTurnGRPOTrainer", "grpo"), "rloo": ("MultiTurnRLOOTrainer", "rloo"),
                          "ppo": ("MultiTurnPPOTrainer", "gae"),
                          "reinforce_pp": ("MultiTurnGRPOTrainer", "reinforce_pp")}
    budgets = {(c.per_device_train_batch_size, c.max_steps, c.learning_rate, c.temperature, c.beta)
               for _, c in built.values()}
    assert budgets == {(8, 50, 2e-5, 1.0, 0.0)}  # the same episodes, steps, step size, sampling and no KL loss
    assert built["ppo"][1].kl_coef == 0.0  # nor a KL penalty in PPO's reward
    assert set(learning.RL_TITLES) == set(learning.RL_ARMS)


def test_the_learning_benchmark_plays_held_out_games_in_the_eval_shape_and_trains_on_its_own(tmp_path, monkeypatch):
    learning = _learning_benchmark(monkeypatch)
    setting = learning.Setting(sft_games=1, rl_games=1, eval_games=2, eval_shape="w1-o2-q2")
    sets = learning.game_sets(setting, tmp_path / "games")
    shapes = {name: {(row["world_size"], row["nb_objects"], row["quest_length"]) for row in rows}
              for name, rows in sets.items()}
    assert shapes == {"sft": {(2, 3, 4)}, "rl": {(2, 3, 4)}, "eval": {(1, 2, 2)}}
    assert all(Path(row["game_file"]).exists() for rows in sets.values() for row in rows)
    assert learning.Setting().eval_game_shape == (2, 3, 4)  # no --eval-shape: the training shape
    with pytest.raises(ValueError, match="w2o6"):
        learning.Setting(eval_shape="w2o6")


def test_the_learning_benchmark_reuses_an_evaluation_only_of_the_same_model_on_the_same_games(tmp_path, monkeypatch):
    learning = _learning_benchmark(monkeypatch)
    start = tmp_path / "sft"
    played = {"successes": 1, "n": 2, "model": str(start), "outcomes": {"400": True, "401": False}}
    source = tmp_path / "seed1.json"
    source.write_text(json.dumps({"setting": dataclasses.asdict(learning.Setting(max_turns=12, eval_first_game=400)),
                                  "eval": {"sft": played}}))
    ours = learning.Setting(max_turns=12, eval_first_game=400, seed=2)  # another seed: the start plays the same
    reused = learning.reused_evaluation("sft", source, start, ours)
    assert reused["outcomes"] == played["outcomes"] and str(source) in reused["copied_from"]
    with pytest.raises(SystemExit, match="max_turns.*12, 16"):
        learning.reused_evaluation("sft", source, start, learning.Setting(max_turns=16, eval_first_game=400))
    with pytest.raises(SystemExit, match="shape.*w2-o3-q4', 'w2-o6-q6"):
        learning.reused_evaluation("sft", source, start, dataclasses.replace(ours, eval_shape="w2-o6-q6"))
    with pytest.raises(SystemExit, match="same model"):
        learning.reused_evaluation("sft", source, tmp_path / "other", ours)
    with pytest.raises(SystemExit, match="no evaluation of 'grpo'"):
        learning.reused_evaluation("grpo", source, start, ours)


# -- the committed results, recomputed ----------------------------------------------------------------------------

RESULTS = ROOT / "benchmarks" / "results"


def _evaluation(spec: str, name: str) -> dict:
    """Model `name`'s held-out evaluation in a committed results file (`FILE:NAME` names another model)."""
    path, _, named = spec.partition(":")
    return json.loads((RESULTS / path).read_text())["eval"][named or name]


def _effect(arm: tuple[str, list[str]], baseline: tuple[str, list[str]]):
    """The per-seed differences of greedy success (arm minus baseline, each `(model, files)`) and their effect."""
    differences = []
    for a, b in zip(*(([_evaluation(spec, name) for spec in specs]) for name, specs in (arm, baseline))):
        differences.append(a["successes"] / a["n"] - b["successes"] / b["n"])
    return differences, seed_effect(differences)


def _points(x: float, digits: int = 1) -> str:
    return f"{100 * x:+.{digits}f}"


def _summary(differences, e, digits: int = 1) -> tuple[str, str, str]:
    """Per-seed points, mean and t interval, as docs/results.md writes them."""
    return (", ".join(_points(d, digits) for d in differences), _points(e.mean),
            f"{_points(e.ci_low)} to {_points(e.ci_high)}")


def test_the_registered_comparisons_docs_results_prints_recompute_from_the_committed_results():
    """Every registered test docs/results.md reports (rounds 5-9), recomputed from benchmarks/results/ by this
    module's statistics and written in the document's own rounding: a change of library or formula that moved any
    printed figure fails here."""
    docs = " ".join((ROOT / "docs" / "results.md").read_text().split())
    controls = [f"controls/seed{s}.json" for s in (1, 2, 3, 4)]
    expected = []

    # Round 5 across seeds: the 400-episode GRPO runs against the start and the control, on both held-out sets.
    first = ["learning_converged.json", *(f"learning_round5_seed{s}.json" for s in (3, 4, 5))]
    fresh = [f"learning_confirmation.json:grpo_r5_seed{s}_400" for s in (3, 4, 5)]
    played = ["learning_confirmation.json"] * 3  # where the fresh set's baselines were played
    (d1, s1), (d2, s2) = _effect(("grpo", first), ("sft", first)), _effect(("grpo", fresh), ("sft", played))
    (_, c1), (_, c2) = _effect(("grpo", first), ("sft_more", first)), _effect(("grpo", fresh), ("sft_more", played))
    seeds, mean, ci = _summary(d1, s1, digits=0)
    expected.append(f"Against the SFT start: {mean} points on the first 100 games (seeds 0, 3, 4, 5: {seeds}; 95% "
                    f"interval {ci}, t p = {s1.t_p:.2g}, sign-flip p = {s1.sign_flip_p:.3g}) and {_points(s2.mean)} "
                    f"on the 300 fresh ones (seeds 3, 4, 5, the only 400-episode models played there: interval "
                    f"{_summary(d2, s2)[2]}, t p = {s2.t_p:.2g}). Against the continued-SFT control: "
                    f"{_points(c1.mean)} points on the first set (interval {_summary([], c1)[2]}, t p = "
                    f"{c1.t_p:#.2g}) and {_points(c2.mean)} on the fresh set ({_summary([], c2)[2]}, t p = "
                    f"{c2.t_p:.2g}).")
    q = holm([s1.t_p, s2.t_p, c1.t_p, c2.t_p])
    expected.append(f"Holm over them gives {q[0]:#.2g}, {q[1]:#.2g}, {q[2]:#.2g} and {q[3]:#.2g}")

    # Round 6: GRPO against the two data-matched controls, Holm over the two.
    (dm, em), (dr, er) = (_effect(("grpo", controls), (control, controls)) for control in ("sft_matched", "sft_rs"))
    qm, qr = holm([em.t_p, er.t_p])
    seeds, mean, ci = _summary(dm, em)
    expected.append(f"GRPO minus `sft_matched`: {seeds} points (seeds 1-4); mean {mean}, 95% t interval {ci}, t p = "
                    f"{em.t_p:#.2g}, Holm-adjusted {qm:#.2g}.")
    seeds, mean, ci = _summary(dr, er)
    expected.append(f"GRPO minus `sft_rs`: {seeds} points; mean {mean}, 95% t interval {ci}, t p = {er.t_p:#.2g}, "
                    f"Holm {qr:#.2g}:")

    # Round 7: PPO and GRPO against RLOO, Holm over the two.
    (_, eg), (_, ep) = (_effect((arm, controls), ("rloo", controls)) for arm in ("grpo", "ppo"))
    for e, p_format in ((eg, ".3g"), (ep, ".2g")):
        expected.append(f"Mean **{_points(e.mean)} points** (95% t interval {_summary([], e)[2]}; seed-to-seed sd "
                        f"{100 * e.sd:.1f}; t p = {e.t_p:{p_format}}; exact sign-flip p = {e.sign_flip_p:.3g})")
    qp, qg = holm([ep.t_p, eg.t_p])
    expected.append(f"PPO minus RLOO {ep.t_p:.2g} -> {qp:.2g}, GRPO minus RLOO {eg.t_p:.2g} -> {qg:.2g}.")

    # Round 8: 8 turns against 6, 16 against 8, Holm over the two; 12 turns against its start (exploratory).
    budget = {turns: [f"budget/turns{turns}_seed{s}.json" for s in (1, 2, 3, 4)] for turns in (6, 12, 16)}
    rows = [("8 turns minus 6", *_effect(("grpo", controls), ("grpo", budget[6]))),
            ("16 turns minus 8", *_effect(("grpo", budget[16]), ("grpo", controls)))]
    # Round 9: the transfer arm against the start, the direct arm against the transfer arm, Holm over the two.
    transfer = [f"transfer/seed{s}.json" for s in (1, 2, 3, 4)]
    rows9 = [("transfer arm minus the start", *_effect(("grpo_simple", transfer), ("sft", transfer))),
             ("direct arm minus the transfer arm", *_effect(("grpo", transfer), ("grpo_simple", transfer)))]
    for family in (rows, rows9):
        for (label, differences, e), q in zip(family, holm([e.t_p for _, _, e in family])):
            seeds, mean, ci = _summary(differences, e)
            expected.append(f"| {label} | {seeds} | {mean} | {ci} | {e.t_p:.3g} | {q:.3g} |")
    _, e12 = _effect(("grpo", budget[12]), ("sft", budget[12]))
    expected.append(f"12 turns {_points(e12.mean)} (interval {_summary([], e12)[2]}, p = {e12.t_p:.2g})")

    missing = [line for line in expected if line not in docs]
    assert not missing, "docs/results.md does not print these recomputed figures:\n" + "\n".join(missing)


def test_the_committed_seed_reports_are_what_the_command_prints_now(monkeypatch):
    """benchmarks/results/controls/round6_test.md and learning_seeds.md hold `learning.py seeds` outputs: the command
    reprints each, table rows (per-run McNemar p) and summaries (t interval, t and sign-flip p, Holm) to the letter."""
    learning = _learning_benchmark(monkeypatch)
    monkeypatch.chdir(ROOT)  # the reports name the results files relative to the checkout
    round6 = (RESULTS / "controls" / "round6_test.md").read_text()
    runs = [f"benchmarks/results/controls/seed{s}.json" for s in (1, 2, 3, 4)]
    assert learning.seeds_report(runs, "grpo", ["sft_matched", "sft_rs"]) == round6[round6.index("### "):].strip()
    sections = (RESULTS / "learning_seeds.md").read_text().split("\n    python benchmarks/learning.py seeds ")[1:]
    assert len(sections) == 4
    for section in sections:
        command, _, printed = section.partition("\n")
        flag, baseline, runs_flag, *runs = command.split()
        assert (flag, runs_flag) == ("--baseline", "--runs")
        assert learning.seeds_report(runs, "grpo", [baseline]) == printed.split("\n## ")[0].strip(), command
