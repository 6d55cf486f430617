"""Does multi-turn RL make an agent better than its supervised (SFT) start? Measured on TextWorld, offline, on CPU.

The offline SmolLM2-135M-Instruct is first taught the game format by SFT on the walkthroughs of a few generated
games; from that one checkpoint, GRPO, RLOO, PPO and REINFORCE++ each train on other games with a stated budget of
episodes, and controls continue SFT (on the same walkthroughs, on the RL games' walkthroughs, or on the model's own won
RL-game episodes). Every arm is then played greedily on the same held-out games, and each RL arm is compared with the
controls and with the SFT start by an exact McNemar test on the paired per-game outcomes.

    python benchmarks/learning.py run                     # every stage in order (hours on 2 cores); resumable
    python benchmarks/learning.py run --stages grpo eval  # some stages (a finished stage is skipped; --force redoes)
    python benchmarks/learning.py report                  # table and curves from the results JSON
    python benchmarks/learning.py seeds --baseline sft --runs A.json B.json C.json:grpo_seed3   # across seeds
    python benchmarks/learning.py seeds --runs A.json B.json --against 6-turns A6.json B6.json  # across files

Stages (checkpoints go to --work-dir, results to --results, one JSON and one PNG):

    games     the three disjoint game sets: SFT games (train-split seeds from 0), RL games (train-split seeds from
              500000) and evaluation games (test-split seeds from 0; of another shape with `--eval-shape`, e.g.
              w2-o6-q6, to measure transfer); generated once and cached
    sft       SFT warm start on the SFT games' walkthroughs (`--sft-start PATH` starts from an existing SFT
              checkpoint instead, e.g. an earlier run's control, so that RL starts from a converged SFT model)
    grpo, rloo, ppo, reinforce_pp   RL from the SFT checkpoint on the RL games, `--rl-episodes` episodes each
              (REINFORCE++: GRPO's trainer with the `reinforce_pp` advantage estimator); a model-only checkpoint
              every 1/curve_points of the budget, for the held-out learning curve
    sft_more  the control: SFT continued from the SFT checkpoint on the same walkthroughs (constant learning rate)
              until it has used the CPU time of the longest RL arm trained before it (CPU time, not wall time:
              other jobs on a shared machine slow the arms unequally), or `--control-cpu-budget` seconds, so that it
              can run in a parallel process (stages in parallel processes share one results file safely)
    sft_matched  a data-matched control: SFT continued from the SFT checkpoint on the walkthroughs of the RL
              games themselves, for as many episodes as an RL arm plays (`--rl-episodes`: rl_episodes / rl_games
              epochs), so that it sees the games RL saw
    sft_rs    rejection-sampling SFT at equal episodes: the SFT checkpoint plays `--rl-episodes` episodes of the RL
              games (each game `--num-generations` times, sampled at `--temperature`, as an RL arm's rollouts), and
              SFT continues on the episodes it won (one epoch, its own tokens re-tokenized by the SFT trainer)
    eval      greedy success of every trained model (and of each RL arm's intermediate checkpoints, and of any model
              named by `--eval-model NAME=PATH`) on the evaluation games; `--eval-first-game N` plays a fresh held-out
              set (test-split games from N) to confirm a result found on the first one; `--reuse-eval NAME=FILE`
              takes a model's evaluation from another seed's file (the same model, games and rules) instead
    report    the table (Wilson 95% intervals, exact McNemar p-values) and the learning curves

Everything about an episode (system prompt, action parser, turn and token caps) is the same in SFT, RL and
evaluation, so the difference between arms is what their training taught.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import resource
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SYSTEM_PROMPT = ("You are playing a text adventure game. Reply with a single command, such as 'go north', "
                 "'take key' or 'open chest'.")
RL_FIRST_SEED = 500_000  # RL games start here in the train split's seed range: disjoint from the SFT games
RL_ARMS = ("grpo", "rloo", "ppo", "reinforce_pp")
RL_TITLES = {"grpo": "GRPO", "rloo": "RLOO", "ppo": "PPO", "reinforce_pp": "REINFORCE++"}
CONTROLS = ("sft_more", "sft_matched", "sft_rs")  # the SFT-only arms RL is compared with
STAGES = ("games", "sft", *RL_ARMS, *CONTROLS, "eval", "report")


@dataclass
class Setting:
    """The benchmark's fixed choices (saved with the results)."""

    world_size: int = 2
    nb_objects: int = 3
    quest_length: int = 4
    sft_games: int = 40
    rl_games: int = 128
    eval_games: int = 100
    eval_first_game: int = 0  # the evaluation games' first test-split game: another value gives a fresh held-out set
    eval_shape: str = ""  # the evaluation games' shape, e.g. "w2-o6-q6", to measure transfer; "" = the training shape
    max_turns: int = 8
    max_reply_tokens: int = 12
    max_episode_tokens: int = 1024
    sft_epochs: float = 2.0
    sft_learning_rate: float = 1e-4
    rl_episodes: int = 160
    episodes_per_step: int = 8
    num_generations: int = 4
    rl_learning_rate: float = 2e-5
    critic_learning_rate: float = 2e-4
    temperature: float = 1.0
    turn_gamma: float = 0.9  # GRPO/RLOO: a faster win returns more, so a group that always wins still has a signal
    curve_points: int = 1  # model-only checkpoints per RL run, each evaluated for the held-out learning curve
    seed: int = 0
    threads: int = 2
    bf16: bool = False  # bf16 autocast in SFT and RL (2.4x faster training steps on a CPU with AVX512-BF16)
    system_prompt: str = SYSTEM_PROMPT
    sft_start: str = ""  # an SFT checkpoint to start from instead of the sft stage (e.g. a converged earlier control)
    overrides: dict = field(default_factory=dict)  # per-arm config overrides from --arm-option

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.world_size, self.nb_objects, self.quest_length

    def __post_init__(self):
        self.eval_game_shape  # noqa: B018 - a malformed --eval-shape is refused when the setting is made

    @property
    def eval_game_shape(self) -> tuple[int, int, int]:
        from trl_multiturn.envs.textworld.tasks import parse_shape

        return parse_shape(self.eval_shape) if self.eval_shape else self.shape

    @property
    def rl_steps(self) -> int:
        return self.rl_episodes // self.episodes_per_step

    def episode_kwargs(self) -> dict:
        """How every episode is played, in SFT (format), RL and evaluation alike: `evaluate`'s rules. The
        observation cap is off, as it was when the committed results were played."""
        from trl_multiturn.rollout.rules import EpisodeRules

        return dict(rules=EpisodeRules(max_turns=self.max_turns, max_completion_length=self.max_reply_tokens,
                                       max_episode_tokens=self.max_episode_tokens, max_observation_tokens=None,
                                       system_prompt=self.system_prompt, action_parser="first_line"))


class Results:
    """The results JSON: one section per stage, rewritten after each stage so that a run can resume."""

    def __init__(self, path: Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}

    def has(self, key: str) -> bool:
        return key in self.data

    def put(self, key: str, value, entry: str | None = None) -> None:
        """Write one section (or, with `entry`, one entry of section `key`, e.g. one model's evaluation), keeping
        what other processes wrote meanwhile: stages, evaluations included, may run in parallel processes sharing
        one results file."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.reload()
            if entry is None:
                self.data[key] = value
            else:
                self.data.setdefault(key, {})[entry] = value
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
            tmp.replace(self.path)

    def reload(self) -> dict:
        """Read what is on disk now (another process may have written since)."""
        if self.path.exists():
            self.data = json.loads(self.path.read_text())
        return self.data


# -- stages -------------------------------------------------------------------------------------------------------


def game_sets(setting: Setting, games_dir: Path) -> dict:
    from trl_multiturn.envs.textworld.tasks import textworld_tasks

    sets = {
        "sft": dict(split="train", num_games=setting.sft_games, first_game=0),
        "rl": dict(split="train", num_games=setting.rl_games, first_game=RL_FIRST_SEED),
        "eval": dict(split="test", num_games=setting.eval_games, first_game=setting.eval_first_game),
    }
    shapes = {"sft": setting.shape, "rl": setting.shape, "eval": setting.eval_game_shape}
    return {name: textworld_tasks(*shapes[name], games_dir=games_dir, **kwargs) for name, kwargs in sets.items()}


def environment(games_dir: Path):
    from trl_multiturn.envs import TextWorldEnv

    return functools.partial(TextWorldEnv, games_dir=str(games_dir))


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (environment workers), user plus system."""
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def cpu_budget_callback(budget: float):
    """A trainer callback that stops training once `budget` CPU seconds are used after training begins."""
    from transformers import TrainerCallback

    class CPUBudget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = cpu_seconds()

        def on_step_end(self, args, state, control, **kwargs):
            if cpu_seconds() - self.start >= budget:
                control.should_training_stop = True

    return CPUBudget()


def run_sft(setting: Setting, model: str, tasks, games_dir: Path, output_dir: Path, epochs: float,
            cpu_budget: float | None = None) -> dict:
    """SFT for `epochs` epochs (linear decay), or with `cpu_budget` at a constant rate until that much CPU time is
    used (`epochs` then caps it)."""
    from trl_multiturn import MultiTurnSFTConfig, MultiTurnSFTTrainer

    config = MultiTurnSFTConfig(
        output_dir=str(output_dir), system_prompt=setting.system_prompt, action_parser="first_line",
        max_length=None, num_train_epochs=epochs, per_device_train_batch_size=2,
        learning_rate=setting.sft_learning_rate, lr_scheduler_type="constant" if cpu_budget else "linear",
        warmup_steps=0 if cpu_budget else 2,
        activation_checkpointing=False, use_cpu=True, bf16=setting.bf16, logging_steps=5, save_strategy="no",
        report_to="none", seed=setting.seed,
    )
    clock, cpu = time.perf_counter(), cpu_seconds()
    callbacks = [cpu_budget_callback(cpu_budget)] if cpu_budget else None
    trainer = MultiTurnSFTTrainer(model, args=config, environment_factory=environment(games_dir),
                                  train_dataset=tasks, callbacks=callbacks)
    result = trainer.train()
    seconds, cpu = time.perf_counter() - clock, cpu_seconds() - cpu
    trainer.save_model(str(output_dir))
    episodes = trainer.train_dataset
    return {
        "seconds": seconds, "cpu_seconds": cpu, "epochs": trainer.state.epoch, "steps": trainer.state.global_step,
        "examples": len(episodes), "tokens": sum(len(ids) for ids in episodes["input_ids"]),
        "final_train_loss": result.training_loss, "log": trainer.state.log_history,
    }


def rl_game_plays(setting: Setting, rl_tasks) -> list[dict]:
    """The task rows an RL arm's `rl_episodes` episodes play: each RL game `num_generations` times in a row, in the
    order of the games (fewer episodes than games x generations use the first games)."""
    rows = [row for row in rl_tasks for _ in range(setting.num_generations)]
    return rows[: setting.rl_episodes]


def run_sft_rs(setting: Setting, model: str, rl_tasks, games_dir: Path, output_dir: Path) -> dict:
    """Rejection-sampling SFT: `model` plays the RL arms' episodes (sampled at the RL temperature), and SFT continues
    for one epoch on the episodes it won."""
    from trl_multiturn.evaluation import evaluate

    clock, cpu = time.perf_counter(), cpu_seconds()
    played = evaluate(model, environment(games_dir), rl_game_plays(setting, rl_tasks), batch_size=25,
                      temperature=setting.temperature, progress=False, **setting.episode_kwargs())
    won = played.to_dataset().filter(lambda row: row["won"])
    sampling = {"sampled_episodes": played.n + played.failed, "won_episodes": len(won),
                "sampling_seconds": time.perf_counter() - clock, "sampling_cpu_seconds": cpu_seconds() - cpu}
    if not len(won):
        raise SystemExit(f"sft_rs: the SFT start won none of its {sampling['sampled_episodes']} sampled episodes, "
                         "so there is nothing to train on")
    trained = run_sft(setting, model, won.select_columns(["messages"]), games_dir, output_dir, epochs=1.0)
    return trained | sampling | {"seconds": trained["seconds"] + sampling["sampling_seconds"],
                                 "cpu_seconds": trained["cpu_seconds"] + sampling["sampling_cpu_seconds"]}


def rl_config(arm: str, setting: Setting, output_dir: Path):
    """The arm's trainer class and config: the same episodes, budget and learning rate for every algorithm."""
    from trl_multiturn import (
        MultiTurnGRPOConfig,
        MultiTurnGRPOTrainer,
        MultiTurnPPOConfig,
        MultiTurnPPOTrainer,
        MultiTurnRLOOConfig,
        MultiTurnRLOOTrainer,
    )

    every = max(1, setting.rl_steps // setting.curve_points)
    common = dict(
        output_dir=str(output_dir), max_turns=setting.max_turns, max_completion_length=setting.max_reply_tokens,
        max_episode_tokens=setting.max_episode_tokens, system_prompt=setting.system_prompt,
        action_parser="first_line", reward_mode="sparse", temperature=setting.temperature,
        per_device_train_batch_size=setting.episodes_per_step, learning_rate=setting.rl_learning_rate,
        max_steps=setting.rl_steps, lr_scheduler_type="constant", logging_steps=1, save_strategy="steps",
        save_steps=every, save_only_model=True, use_cpu=True, bf16=setting.bf16, report_to="none", seed=setting.seed,
        beta=0.0,
    )
    if arm in ("grpo", "reinforce_pp"):  # REINFORCE++: GRPO's loss, returns normalised over the batch, not per group
        trainer_cls, config = MultiTurnGRPOTrainer, MultiTurnGRPOConfig(
            num_generations=setting.num_generations, turn_gamma=setting.turn_gamma, advantage_estimator=arm, **common)
    elif arm == "rloo":
        trainer_cls, config = MultiTurnRLOOTrainer, MultiTurnRLOOConfig(
            num_generations=setting.num_generations, turn_gamma=setting.turn_gamma, **common)
    elif arm == "ppo":
        trainer_cls, config = MultiTurnPPOTrainer, MultiTurnPPOConfig(
            num_generations=1, critic_learning_rate=setting.critic_learning_rate, kl_coef=0.0, **common)
    else:
        raise ValueError(f"unknown RL arm {arm!r}: choose one of {RL_ARMS}")
    for key, value in setting.overrides.get(arm, {}).items():
        setattr(config, key, value)
    return trainer_cls, config


def run_rl(arm: str, setting: Setting, model: str, tasks, games_dir: Path, output_dir: Path) -> dict:
    trainer_cls, config = rl_config(arm, setting, output_dir)
    clock, cpu = time.perf_counter(), cpu_seconds()
    trainer = trainer_cls(model=model, args=config, environment_factory=environment(games_dir), train_dataset=tasks)
    trainer.train()
    trainer.close()  # environment workers end (and are counted in cpu_seconds) before the clock stops
    seconds, cpu = time.perf_counter() - clock, cpu_seconds() - cpu
    trainer.save_model(str(output_dir))
    episodes = trainer.state.global_step * setting.episodes_per_step
    checkpoints = sorted((p for p in output_dir.glob("checkpoint-*")), key=lambda p: int(p.name.split("-")[1]))
    return {
        "seconds": seconds, "cpu_seconds": cpu, "steps": trainer.state.global_step, "episodes": episodes,
        "config": {k: v for k, v in config.to_dict().items() if _jsonable(v)},
        "checkpoints": [{"step": int(p.name.split("-")[1]), "path": str(p)} for p in checkpoints],
        "log": trainer.state.log_history,
    }


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except TypeError:
        return False


def evaluate_model(model_path: str, setting: Setting, tasks, games_dir: Path) -> dict:
    from trl_multiturn.evaluation import evaluate

    clock = time.perf_counter()
    result = evaluate(model_path, environment(games_dir), tasks, batch_size=25, **setting.episode_kwargs())
    outcomes = {str(ep.task["seed"]): bool(ep.won) for ep in result.episodes if not ep.failed}
    return {
        "successes": result.successes, "n": result.n, "failed": result.failed, "ci_low": result.ci_low,
        "ci_high": result.ci_high, "mean_turns": result.mean_turns, "seconds": time.perf_counter() - clock,
        "model": model_path, "outcomes": outcomes,
    }


def training_shape(setting: dict) -> str:
    """A saved setting's training shape by the paper's name, e.g. "w2-o3-q4"."""
    return f"w{setting.get('world_size')}-o{setting.get('nb_objects')}-q{setting.get('quest_length')}"


def evaluation_conditions(setting: dict) -> dict:
    """What fixes a greedy evaluation's outcomes besides the model: the held-out games and how an episode is played."""
    return {"shape": setting.get("eval_shape") or training_shape(setting), **{key: setting[key] for key in (
        "eval_first_game", "eval_games", "max_turns", "max_reply_tokens", "max_episode_tokens", "system_prompt")}}


def reused_evaluation(name: str, source: Path, model: Path | None, setting: Setting) -> dict:
    """Model `name`'s evaluation from another results file, instead of playing it again: greedy evaluation is
    deterministic (round 6's seeds 1 and 2 played the start in processes of their own and agree game by game), so a
    model played on the same games under the same rules has the same outcomes. Refused unless both hold."""
    data = Results(source).data
    found = data.get("eval", {}).get(name)
    if found is None:
        raise SystemExit(f"--reuse-eval {name}={source}: no evaluation of {name!r} there")
    if model is None or Path(found["model"]).resolve() != model.resolve():
        raise SystemExit(f"--reuse-eval {name}={source}: that evaluation played {found['model']}, and this run's "
                         f"{name!r} is {model}; reuse only an evaluation of the same model")
    theirs, ours = evaluation_conditions(data["setting"]), evaluation_conditions(asdict(setting))
    differ = {key: (theirs[key], ours[key]) for key in ours if theirs[key] != ours[key]}
    if differ:
        raise SystemExit(f"--reuse-eval {name}={source}: played under other conditions ({differ}, theirs then "
                         "ours); play it here instead")
    return found | {"copied_from": f"{source}: greedy evaluation is deterministic, and that file played the same "
                    "model on the same games under the same rules"}


# -- report -------------------------------------------------------------------------------------------------------


def comparison(results: Results, arm: str, baseline: str):
    from trl_multiturn.statistics import paired_test

    evals = results.data.get("eval", {})
    if arm not in evals or baseline not in evals:
        return None
    return paired_test(evals[arm]["outcomes"], evals[baseline]["outcomes"])


def training_text(arm: str, trained: dict) -> str:
    """The report's "training" cell for one of the benchmark's own arms."""
    if arm == "sft":
        if "from" in trained:
            return f"SFT checkpoint {trained['from']}"
        return f"SFT, {trained.get('examples')} walkthroughs x {trained.get('epochs')} epochs"
    if arm == "sft_more":
        return f"+ SFT, {trained.get('epochs', 0):.1f} more epochs"
    if arm == "sft_matched":
        return f"+ SFT on the RL games' walkthroughs, {trained.get('epochs', 0):.1f} epochs"
    if arm == "sft_rs":
        return (f"+ SFT on its own {trained.get('won_episodes')} won of {trained.get('sampled_episodes')} sampled "
                "RL-game episodes")
    return f"+ {RL_TITLES[arm]}, {trained.get('episodes')} episodes"


def report(results: Results, curves_path: Path) -> str:
    evals = results.data.get("eval", {})
    setting = results.data.get("setting", {})
    trained_on = training_shape(setting)
    lines = [
        f"TextWorld {trained_on}, offline SmolLM2-135M-Instruct, greedy success on {setting.get('eval_games')} "
        f"held-out {setting.get('eval_shape') or trained_on} games (test-split games from "
        f"{setting.get('eval_first_game', 0)}, at most {setting.get('max_turns')} turns). "
        "p: exact McNemar test on the paired per-game outcomes.",
        "",
    ]
    baselines = ["sft", *(name for name in CONTROLS if name in evals)]
    titles = {"sft": "SFT start", "sft_more": "continued SFT", "sft_matched": "SFT on RL games",
              "sft_rs": "rejection-sampling SFT"}
    lines += ["| arm | training | wall time | CPU time | held-out success (95% CI) | "
              + " | ".join(f"vs {titles[name]}: +/- games, p" for name in baselines) + " |",
              "|---|---|---|---|---|" + "---|" * len(baselines)]
    named = ("sft", *CONTROLS, *RL_ARMS)
    others = [name for name in evals if name not in named and "@" not in name]  # --eval-model's models
    for arm in [name for name in named if name in evals] + others:
        ev, trained = evals[arm], results.data.get(arm, {})
        seconds, cpu = trained.get("seconds"), trained.get("cpu_seconds")
        cells = [arm, training_text(arm, trained) if trained else f"model {ev.get('model')}",
                 "" if seconds is None else f"{seconds / 60:.0f} min", "" if cpu is None else f"{cpu / 60:.0f} min",
                 f"{ev['successes']}/{ev['n']} = {ev['successes'] / max(1, ev['n']):.0%} "
                 f"({ev['ci_low']:.0%}-{ev['ci_high']:.0%})"]
        for baseline in baselines:
            c = comparison(results, arm, baseline) if arm != baseline else None
            cells.append("" if c is None else f"+{c.only_a}/-{c.only_b}, p={c.p_value:.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    if any(results.has(arm) for arm in RL_ARMS):  # a file of --eval-model results only has no curves
        plot_curves(results, curves_path)
    return "\n".join(lines)


def _split_spec(spec: str, default_name: str) -> tuple[str, str]:
    """`FILE:NAME` -> (FILE, NAME); a bare FILE names its model `default_name`."""
    return tuple(spec.rpartition(":")[::2]) if ":" in spec else (spec, default_name)


def seeds_report(runs: list[str], arm: str, baselines: list[str], against: list[list[str]] = ()) -> str:
    """The recipe-level effect of an arm over each of `baselines` and `against`. `runs`: one per seed, each a
    results file (its arm named `arm`) or `FILE:NAME` (the model evaluated as NAME in FILE, e.g. an
    `--eval-model`), all played on the same held-out games. A baseline is a model evaluated in each run's own file;
    an `against` group is `[LABEL, SPEC, ...]` with one SPEC (FILE or FILE:NAME, as `runs`) per run, for a baseline
    in another file (e.g. the same algorithm at another turn budget). Per comparison: the per-seed differences of
    greedy success with each run's McNemar test, then their mean with a t interval and the t and exact sign-flip
    p-values (`trl_multiturn.statistics.seed_effect`). With more than one comparison the t p-values are one family,
    Holm-adjusted (`trl_multiturn.statistics.holm`)."""
    from trl_multiturn.statistics import holm, paired_test, seed_effect

    loaded = {}  # each results file read once

    def evaluations(specs: list[str], name: str, what: str) -> list[dict]:
        found = []
        for spec in specs:
            path, model = _split_spec(spec, name)
            if path not in loaded:
                loaded[path] = Results(Path(path)).data.get("eval", {})
            found.append(loaded[path].get(model))
        missing = [spec for spec, evaluation in zip(specs, found) if evaluation is None]
        if missing:
            raise SystemExit(f"seeds: {', '.join(missing)}: no evaluation of {what} there")
        return found

    files = [_split_spec(run, arm)[0] for run in runs]
    arms = evaluations(runs, arm, "the arm")
    comparisons = {baseline: evaluations([f"{file}:{baseline}" for file in files], baseline, f"'{baseline}'")
                   for baseline in baselines}  # label -> the baseline's evaluation per run
    for label, *specs in against:
        if label in comparisons:
            raise SystemExit(f"seeds: --against {label}: that label names another comparison; give each its own")
        if len(specs) != len(runs):
            raise SystemExit(f"seeds: --against {label}: {len(specs)} files for {len(runs)} runs; give one per run, "
                             "in the same order")
        comparisons[label] = evaluations(specs, arm, f"'{label}'")
    if len({tuple(sorted(e["outcomes"])) for evals in [arms, *comparisons.values()] for e in evals}) > 1:
        raise SystemExit("seeds: the runs were played on different held-out games")
    lines, effects = [], []
    for label, evals in comparisons.items():
        if len(comparisons) > 1:
            lines += [f"### {arm} vs {label}", ""]
        lines += [f"| run | its success | {label} | difference | this run vs {label}: +/- games, p |",
                  "|---|---:|---:|---:|---|"]
        differences = []
        for run, a, b in zip(runs, arms, evals):
            differences.append(a["successes"] / a["n"] - b["successes"] / b["n"])
            c = paired_test(a["outcomes"], b["outcomes"])
            lines.append(f"| {run} | {a['successes']}/{a['n']} | {b['successes']}/{b['n']} | "
                         f"{differences[-1]:+.1%} | +{c.only_a}/-{c.only_b}, p={c.p_value:.3g} |")
        e = seed_effect(differences)
        effects.append(e)
        lines += ["", f"Across {e.n} seeds: mean difference {e.mean:+.1%} (95% t interval {e.ci_low:+.1%} to "
                      f"{e.ci_high:+.1%}; seed-to-seed sd {e.sd:.1%}); t test p = {e.t_p:.3g}; exact sign-flip p = "
                      f"{e.sign_flip_p:.3g} (its smallest possible value with {e.n} seeds: {2 / 2 ** e.n:.3g}).", ""]
    if len(comparisons) > 1:
        adjusted = holm([e.t_p for e in effects])
        lines.append(f"Holm over the {len(comparisons)} comparisons (t p -> adjusted): " + "; ".join(
            f"vs {label}: {e.t_p:.3g} -> {q:.3g}" for label, e, q in zip(comparisons, effects, adjusted)) + ".")
    return "\n".join(lines).rstrip()


def plot_curves(results: Results, path: Path) -> None:
    """Left: training success (sampled, per step) against episodes; right: held-out greedy success at the
    intermediate checkpoints (the SFT start at 0 episodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (train_ax, held_ax) = plt.subplots(1, 2, figsize=(11, 4))
    evals = results.data.get("eval", {})
    start = evals.get("sft")
    for arm in RL_ARMS:
        run = results.data.get(arm)
        if not run:
            continue
        per_step = run["episodes"] / max(1, run["steps"])
        points = [(entry["step"] * per_step, entry["episodes/success_rate"]) for entry in run["log"]
                  if "episodes/success_rate" in entry]
        if points:
            xs, ys = zip(*points)
            window = 5
            smooth = [sum(ys[max(0, i - window + 1): i + 1]) / len(ys[max(0, i - window + 1): i + 1])
                      for i in range(len(ys))]
            train_ax.plot(xs, smooth, label=RL_TITLES[arm])
        held = [(0, start["successes"] / start["n"])] if start else []
        for ck in run.get("checkpoints", []):
            key = f"{arm}@{ck['step']}"
            if key in evals:
                held.append((ck["step"] * per_step, evals[key]["successes"] / evals[key]["n"]))
        if arm in evals:
            held.append((run["episodes"], evals[arm]["successes"] / evals[arm]["n"]))
        if held:
            xs, ys = zip(*sorted(dict(held).items()))
            held_ax.plot(xs, ys, marker="o", label=RL_TITLES[arm])
    if "sft_more" in evals:
        control = evals["sft_more"]
        held_ax.axhline(control["successes"] / control["n"], color="grey", linestyle="--", label="SFT control")
    train_ax.set(title="training success (sampled, 5-step mean)", xlabel="episodes", ylabel="success rate")
    held_ax.set(title="held-out greedy success", xlabel="episodes", ylabel="success rate", ylim=(0, 1))
    for ax in (train_ax, held_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- driver -------------------------------------------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "report", "seeds"])
    parser.add_argument("--runs", nargs="+", default=[], metavar="FILE[:NAME]",
                        help="seeds: one run per seed, a results file (its --arm) or FILE:NAME (a model evaluated "
                        "as NAME there), each with --baseline evaluated on the same games")
    parser.add_argument("--arm", default="grpo", help="seeds: the arm whose recipe is assessed")
    parser.add_argument("--baseline", nargs="+", default=None,
                        help="seeds: what it is compared with in each run's own file (e.g. sft, sft_more; default: "
                        "sft unless --against is given); all comparisons are one family, Holm-adjusted")
    parser.add_argument("--against", nargs="+", action="append", default=[], metavar="LABEL FILE[:NAME]",
                        help="seeds: a comparison with a model in other files, one per run in the order of --runs "
                        "(e.g. the same arm at another turn budget: --against 6-turns budget/turns6_seed1.json ...); "
                        "repeatable")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--force", action="store_true", help="redo the named stages even if they are done")
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results/learning.json"))
    parser.add_argument("--work-dir", type=Path, default=Path("outputs/learning"),
                        help="checkpoints and the game cache (not committed)")
    parser.add_argument("--control-cpu-budget", type=float, default=None, metavar="SECONDS",
                        help="the control's CPU budget, so that it can run in parallel with the RL arms (default: "
                        "the CPU time of the longest RL arm already trained); the report shows both")
    parser.add_argument("--eval-model", action="append", default=[], metavar="NAME=PATH",
                        help="evaluate one more model (e.g. an earlier run's arm) in the eval stage, reported beside "
                        "the arms and compared with the SFT start and control")
    parser.add_argument("--reuse-eval", action="append", default=[], metavar="NAME=FILE",
                        help="take model NAME's evaluation from another results file that played the same model on "
                        "the same games under the same rules (e.g. the start, shared by every seed) instead of "
                        "playing it again; refused otherwise")
    parser.add_argument("--arm-option", action="append", default=[], metavar="ARM.FIELD=VALUE",
                        help="override one config field of an RL arm, e.g. ppo.kl_coef=0.0 (YAML value)")
    for name, default in asdict(Setting()).items():
        if isinstance(default, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=default)
        elif name != "overrides":
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return parser.parse_args()


def main() -> None:
    import torch
    import yaml

    args = parse_args()
    try:
        setting = Setting(**{k: getattr(args, k) for k in asdict(Setting()) if k != "overrides"})
    except ValueError as error:
        raise SystemExit(f"--eval-shape: {error}") from None
    for option in args.arm_option:
        target, _, value = option.partition("=")
        arm, _, key = target.partition(".")
        setting.overrides.setdefault(arm, {})[key] = yaml.safe_load(value)
    results = Results(args.results)
    curves = args.results.with_name(args.results.stem + "_curves.png")
    if args.command == "seeds":
        baselines = args.baseline if args.baseline is not None else [] if args.against else ["sft"]
        print(seeds_report(args.runs, args.arm, baselines, args.against))
        return
    if args.command == "report":
        print(report(results, curves))
        return

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(setting.threads)
    if results.has("setting") and results.data["setting"] != asdict(setting):
        print("note: the results file was made with another setting; stages already done keep theirs")
    results.put("setting", asdict(setting))
    games_dir = args.work_dir / "games"
    sft_dir = Path(setting.sft_start) if setting.sft_start else args.work_dir / "sft"

    def due(stage: str) -> bool:
        return stage in args.stages and (args.force or not results.has(stage))

    from trl_multiturn.models import OFFLINE_DEFAULT_MODEL, resolve_model

    clock = time.perf_counter()
    tasks = game_sets(setting, games_dir)
    if due("games"):
        results.put("games", {name: {"seeds": [rows["seed"][0], rows["seed"][-1]], "count": len(rows)}
                              for name, rows in tasks.items()} | {"seconds": time.perf_counter() - clock})
    if due("sft") and setting.sft_start:
        results.put("sft", {"from": setting.sft_start})
    elif due("sft"):
        results.put("sft", run_sft(setting, resolve_model(OFFLINE_DEFAULT_MODEL), tasks["sft"], games_dir, sft_dir,
                                   setting.sft_epochs))
    for arm in RL_ARMS:
        if due(arm):
            out = args.work_dir / arm
            shutil.rmtree(out, ignore_errors=True)
            results.put(arm, run_rl(arm, setting, str(sft_dir), tasks["rl"], games_dir, out))
    if due("sft_more"):
        budget = args.control_cpu_budget or max(results.data[arm]["cpu_seconds"] for arm in RL_ARMS
                                                if results.has(arm))
        results.put("sft_more", run_sft(setting, str(sft_dir), tasks["sft"], games_dir, args.work_dir / "sft_more",
                                        epochs=100, cpu_budget=budget) | {"cpu_budget": budget})
    if due("sft_matched"):
        epochs = setting.rl_episodes / len(tasks["rl"])
        results.put("sft_matched", run_sft(setting, str(sft_dir), tasks["rl"], games_dir,
                                           args.work_dir / "sft_matched", epochs=epochs))
    if due("sft_rs"):
        results.put("sft_rs", run_sft_rs(setting, str(sft_dir), tasks["rl"], games_dir, args.work_dir / "sft_rs"))
    if "eval" in args.stages:
        models = {"sft": sft_dir, **{name: args.work_dir / name for name in CONTROLS}}
        for arm in RL_ARMS:
            models[arm] = args.work_dir / arm
            run = results.data.get(arm, {})
            for ck in run.get("checkpoints", []):
                if ck["step"] != run["steps"]:  # the last checkpoint is the final model
                    models[f"{arm}@{ck['step']}"] = Path(ck["path"])
        for option in args.eval_model:
            name, _, path = option.partition("=")
            if not (Path(path) / "config.json").exists():
                raise SystemExit(f"--eval-model {option!r}: no model at {path!r}; give NAME=PATH to a saved model")
            models[name] = Path(path)
        for option in args.reuse_eval:
            name, _, source = option.partition("=")
            if name not in results.reload().get("eval", {}):
                results.put("eval", reused_evaluation(name, Path(source), models.get(name), setting), entry=name)
        for name, path in models.items():
            if (args.force or name not in results.reload().get("eval", {})) and (path / "config.json").exists():
                evaluation = evaluate_model(str(path), setting, tasks["eval"], games_dir)
                print(f"eval {name}: {evaluation['successes']}/{evaluation['n']}", flush=True)
                results.put("eval", evaluation, entry=name)
    if "report" in args.stages:
        print(report(results, curves))


if __name__ == "__main__":
    main()
