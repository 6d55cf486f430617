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
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from .config_checks import Range, check_fields

ALGORITHMS = {
    "grpo": ("MultiTurnGRPOTrainer", "MultiTurnGRPOConfig"),
    "rloo": ("MultiTurnRLOOTrainer", "MultiTurnRLOOConfig"),
    "ppo": ("MultiTurnPPOTrainer", "MultiTurnPPOConfig"),
    "none": (None, None),  # pure SFT: `rl` then only gives the held-out episodes their settings
}
ENVIRONMENTS = ("textworld", "alfworld", "swegym")
RUNNER_FIELDS = ("output_dir",)  # set by the runner for every stage; a study does not set them
# StudyData fields that only the held-out games read: runs differing in them share an RL checkpoint.
EVAL_DATA_FIELDS = ("num_eval_games", "eval_shapes", "eval_task_types", "eval_split", "eval_tiers")
# ... and those that only the RL and held-out games read: runs differing in them share an SFT checkpoint.
RL_EVAL_DATA_FIELDS = ("num_train_games", *EVAL_DATA_FIELDS)
SWEGYM_RL_ONLY = ("reward",)  # SWEGymConfig fields an SFT replay of the gold patches does not read
SFT_FORMAT_FIELDS = ("system_prompt", "action_parser", "chat_template_kwargs")  # copied from `rl` into the SFT


@dataclass
class StudyData:
    """Which games a study's runs train and evaluate on."""

    env: str = field(default="textworld", metadata={"help": f"The environment: one of {ENVIRONMENTS}."})
    train_shapes: list[str] = field(
        default_factory=lambda: ["w2-o3-q4"],
        metadata={"help": "TextWorld: the shapes of the training games (w<rooms>-o<objects>-q<quest length>); "
                          "several give a mixture in equal parts."},
    )
    eval_shapes: list[str] | None = field(
        default=None, metadata={"help": "TextWorld: shapes of the held-out games (default: train_shapes)."}
    )
    challenge: str | None = field(
        default=None, metadata={"help": "TextWorld: a challenge such as 'tw-simple' instead of custom shapes."}
    )
    challenge_rewards: str = field(default="dense", metadata={"help": "tw-simple: dense, balanced or sparse."})
    challenge_goal: str = field(default="detailed", metadata={"help": "tw-simple: detailed, brief or none."})
    task_types: list[str] | None = field(
        default=None, metadata={"help": "ALFWorld: task types to train on (default: all six)."}
    )
    eval_task_types: list[str] | None = field(
        default=None, metadata={"help": "ALFWorld: task types of the held-out games (default: all six)."}
    )
    eval_split: str = field(default="valid_unseen", metadata={"help": "ALFWorld: the held-out split."})
    data_path: str | None = field(
        default=None, metadata={"help": "ALFWorld: the downloaded games ($ALFWORLD_DATA); none: generated."}
    )
    num_train_games: int | None = field(
        default=16,
        metadata={"help": "RL training games (train split, from seed 0). ALFWorld, SWE-Gym: None for all."},
    )
    num_eval_games: int | None = field(
        default=100, metadata={"help": "Held-out games (test split). ALFWorld, SWE-Gym: None for all."}
    )
    num_sft_games: int | None = field(
        default=0,
        metadata={"help": "Games whose expert walkthroughs SFT trains on (SWE-Gym: the gold patches of the first "
                          "training tasks). ALFWorld, SWE-Gym: None for all."},
    )
    sft_first_game: int = field(
        default=500_000,
        metadata={"help": "TextWorld: index of the first SFT game in the train split's seeds, so that SFT games "
                          "never overlap the RL games (0 .. num_train_games - 1). ALFWorld's SFT replays the "
                          "experts of its training games, as the paper does."},
    )
    swegym: dict = field(
        default_factory=dict,
        metadata={"help": "SWE-Gym: SWEGymConfig fields of the environment, e.g. {reward: resolved} (binary) or "
                          "{reward: dense} (the FAIL_TO_PASS pass ratio), sandbox, isolation, command_timeout."},
    )
    swegym_dataset: str | None = field(
        default=None,
        metadata={"help": "SWE-Gym: SWE-bench-schema task rows (a Hub id such as SWE-Gym/SWE-Gym, or a local path); "
                          "None: the twelve offline tasks shipped with trl-multiturn."},
    )
    swegym_split: str = field(default="train", metadata={"help": "SWE-Gym: the split of `swegym_dataset`."})
    held_out_fraction: float = field(
        default=0.5,
        metadata={"help": "SWE-Gym: share of the tasks held out for evaluation, each chosen by a hash of its "
                          "instance_id (envs/swegym/selection.py); the rest are the training (and SFT) tasks."},
    )
    tiers: list[str] | None = field(
        default=None,
        metadata={"help": "SWE-Gym: difficulty tiers to train on (easy, medium, hard: thirds of the task set ranked "
                          "by gold patch size, then FAIL_TO_PASS test count); None: all."},
    )
    eval_tiers: list[str] | None = field(
        default=None, metadata={"help": "SWE-Gym: tiers of the held-out tasks evaluated; None: all."}
    )
    games_dir: str | None = field(default=None, metadata={"help": "Game cache folder (default: the env's)."})
    admissible_commands: bool = field(
        default=False, metadata={"help": "List the valid commands in every observation."}
    )

    _RANGES = {"num_train_games": Range(ge=1), "num_eval_games": Range(ge=0), "num_sft_games": Range(ge=0),
               "sft_first_game": Range(ge=0),
               "held_out_fraction": Range(gt=0, lt=1, text="a number between 0 and 1 (exclusive), the share of the "
                                                          "tasks held out for evaluation")}

    def __post_init__(self):
        check_fields(self)

    def check(self) -> None:
        from .envs.textworld.tasks import parse_shape

        if self.env not in ENVIRONMENTS:
            raise ValueError(f"data.env={self.env!r}: choose one of {ENVIRONMENTS}")
        if self.env == "textworld":
            counts = {"num_train_games": self.num_train_games, "num_eval_games": self.num_eval_games,
                      "num_sft_games": self.num_sft_games}
            missing = sorted(name for name, value in counts.items() if value is None)
            if missing:
                raise ValueError(f"data: {missing} must be numbers of TextWorld games (None means all games only "
                                 "for ALFWorld and SWE-Gym)")
        if self.env == "swegym":
            self._check_swegym()
        if self.env == "textworld" and self.challenge is None:
            for shape in [*self.train_shapes, *(self.eval_shapes or [])]:
                parse_shape(shape)
        # TextWorld SFT games come from their own seeds; ALFWorld's SFT replays the training games' experts (as
        # the paper), so there the ranges do not apply.
        if self.env == "textworld" and self.num_sft_games and self.sft_first_game < self.num_train_games:
            raise ValueError(f"data.sft_first_game={self.sft_first_game}: the SFT games overlap the RL games "
                             f"(0 .. {self.num_train_games - 1}); start them at {self.num_train_games} or later")

    def _check_swegym(self) -> None:
        from .envs.swegym import SWEGymConfig
        from .envs.swegym.selection import TIERS

        _check_fields("data.swegym", self.swegym, SWEGymConfig)
        SWEGymConfig(**self.swegym)  # its own checks of the values
        unknown = sorted((set(self.tiers or ()) | set(self.eval_tiers or ())) - set(TIERS))
        if unknown:
            raise ValueError(f"data.tiers / data.eval_tiers: {unknown} are not SWE-Gym tiers; choose from {TIERS}")

    def tasks(self, part: str):
        """The task rows of `part`: "train" (RL), "sft" or "eval"."""
        from .envs.alfworld.tasks import alfworld_tasks
        from .envs.textworld.tasks import textworld_mixture, textworld_tasks

        count = {"train": self.num_train_games, "sft": self.num_sft_games, "eval": self.num_eval_games}[part]
        if self.env == "swegym":
            return self._swegym_tasks(part, count)
        if self.env == "alfworld":
            split = self.eval_split if part == "eval" else "train"
            types = self.eval_task_types if part == "eval" else self.task_types
            return alfworld_tasks(split, count, types, data_path=self.data_path,
                                  games_dir=self.games_dir or "outputs/alfworld_games")
        split = "test" if part == "eval" else "train"
        first = self.sft_first_game if part == "sft" else 0
        if self.challenge is not None:
            return textworld_tasks(challenge=self.challenge, rewards=self.challenge_rewards, goal=self.challenge_goal,
                                   split=split, num_games=count, first_game=first, games_dir=self.games_dir)
        shapes = (self.eval_shapes or self.train_shapes) if part == "eval" else self.train_shapes
        return textworld_mixture(shapes, split=split, num_games=count, first_game=first, games_dir=self.games_dir)

    def _swegym_tasks(self, part: str, count: int | None):
        """SWE-Gym rows of `part`: the held-out side of the split for "eval", the training side for "train" and
        "sft" (SFT replays the gold patches of the first `num_sft_games` training tasks, as ALFWorld's SFT replays
        its training games' experts)."""
        from datasets import Dataset, load_dataset

        from .envs.swegym import task_rows
        from .envs.swegym.selection import select_tasks

        rows = (task_rows() if self.swegym_dataset is None
                else list(load_dataset(self.swegym_dataset, split=self.swegym_split)))
        tiers = self.eval_tiers if part == "eval" else self.tiers
        chosen = select_tasks(rows, part == "eval", self.held_out_fraction, tiers, count)
        if not chosen:
            raise ValueError(f"data: no SWE-Gym {part} tasks in tiers {tiers} with held_out_fraction="
                             f"{self.held_out_fraction} among {len(rows)} tasks; widen the tiers or the fraction")
        return Dataset.from_list(chosen)

    def environment_factory(self):
        if self.env == "swegym":
            from .envs.swegym import SWEGymConfig, SWEGymEnv

            return functools.partial(SWEGymEnv, SWEGymConfig(**self.swegym))
        if self.env == "alfworld":
            from .envs.alfworld import ALFWorldConfig, ALFWorldEnv

            config = ALFWorldConfig(data_path=self.data_path, admissible_commands=self.admissible_commands)
            return functools.partial(ALFWorldEnv, config)
        from .envs.textworld.env import TextWorldEnv

        return functools.partial(TextWorldEnv, games_dir=self.games_dir,
                                 admissible_commands_in_observation=self.admissible_commands)


@dataclass
class StudyEval:
    """How the held-out games are played (the rest of an episode's settings come from the `rl` section)."""

    temperature: float = field(default=0.0, metadata={"help": "0: greedy; the paper validates at 0.4."})
    max_turns: int | None = field(default=None, metadata={"help": "Turns per episode (default: rl.max_turns)."})
    batch_size: int = field(default=16, metadata={"help": "Episodes played at once."})
    start: bool = field(
        default=True,
        metadata={"help": "Also play the held-out games with the run's starting policy (its SFT checkpoint, or the "
                          "model itself without SFT), so the table shows what RL added, with a paired test. Runs "
                          "whose start and held-out episodes are equal share one such evaluation."},
    )

    _RANGES = {"temperature": Range(ge=0), "max_turns": Range(ge=1), "batch_size": Range(ge=1)}

    def __post_init__(self):
        check_fields(self)


@dataclass
class StudyRun:
    """One run of a study: the base pipeline with its changes applied."""

    name: str
    model: str
    data: StudyData
    sft: dict | None
    algorithm: str
    rl: dict
    eval: StudyEval
    changed: dict = field(default_factory=dict)
    expected: float | str | None = None

    def settings(self) -> dict:
        return {"model": self.model, "data": dataclasses.asdict(self.data), "sft": self.sft,
                "algorithm": self.algorithm, "rl": self.rl, "eval": dataclasses.asdict(self.eval)}

    def fingerprint(self) -> str:
        return _digest(self.settings())

    def sft_inputs(self) -> dict | None:
        """Everything the run's SFT checkpoint depends on: the starting model, the SFT config with the episode
        format it copies from `rl`, and every `data` field except those only the RL and held-out games read
        (`RL_EVAL_DATA_FIELDS`), so that a data field added later keeps runs apart until it is listed there."""
        if self.sft is None:
            return None
        data = {k: v for k, v in dataclasses.asdict(self.data).items() if k not in RL_EVAL_DATA_FIELDS}
        data["swegym"] = {k: v for k, v in data["swegym"].items() if k not in SWEGYM_RL_ONLY}
        return {"model": self.model, "data": data, "sft": {**sft_format(self.rl), **self.sft}}

    def sft_key(self) -> str | None:
        """Runs with equal `sft_inputs` share one SFT checkpoint (trained once, reused by the others)."""
        inputs = self.sft_inputs()
        return None if inputs is None else _digest(inputs)[:12]

    def rl_inputs(self) -> dict | None:
        """Everything the run's RL checkpoint depends on: its start (the SFT inputs, or the model), the algorithm and
        its config, and every `data` field except those only the held-out games read (`EVAL_DATA_FIELDS`)."""
        if self.algorithm == "none":
            return None
        data = {k: v for k, v in dataclasses.asdict(self.data).items() if k not in EVAL_DATA_FIELDS}
        return {"start": self.sft_inputs() or self.model, "algorithm": self.algorithm, "rl": self.rl, "data": data}

    def rl_key(self) -> str | None:
        """Runs with equal `rl_inputs`, in this study or another, share one RL checkpoint."""
        inputs = self.rl_inputs()
        return None if inputs is None else _digest(inputs)[:12]

    def stage_dirs(self, output_dir: Path) -> tuple[Path | None, Path | None]:
        """Where the run's SFT and RL checkpoints live: `<output_dir>/sft-<sft_key>` and
        `<output_dir>/<algorithm>-<rl_key>` (None for a stage the run does not have)."""
        sft, rl = self.sft_key(), self.rl_key()
        return (output_dir / f"sft-{sft}" if sft else None, output_dir / f"{self.algorithm}-{rl}" if rl else None)


@dataclass
class Study:
    name: str
    runs: list[StudyRun]
    output_dir: Path
    results: Path
    paper: str = ""
    hardware: str = ""
    description: str = ""
    primary: list[tuple[str, str]] = field(default_factory=list)  # (run, "start" or another run), pre-registered


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _config_class(name: str):
    import trl_multiturn

    return getattr(trl_multiturn, name)


def _check_fields(section: str, values: dict, *classes) -> None:
    known = {f.name for cls in classes for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        names = " or ".join(cls.__name__ for cls in classes)
        raise ValueError(f"{section}: {unknown} are not fields of {names}; see its documentation for the field "
                         "names")
    taken = sorted(set(values) & set(RUNNER_FIELDS))
    if taken:
        raise ValueError(f"{section}: {taken} are set by the study runner; remove them from the study file")


def _apply(base: dict, changes: dict) -> dict:
    """A copy of `base` with dotted-path `changes` applied: {"rl.max_turns": 6} sets base["rl"]["max_turns"]; a
    section name alone ({"sft": None}) replaces the whole section. Nothing of `base` or `changes` is shared with the
    result: a YAML anchor hands one dict object to every run that names it, and a later dotted change must not
    reach the other runs through it."""
    out = copy.deepcopy(base)
    for path, value in copy.deepcopy(changes).items():
        *parents, leaf = path.split(".")
        target = out
        for key in parents:
            if not isinstance(target.get(key), dict):
                raise ValueError(f"change {path!r}: {key!r} is not a section of the study (or it is null)")
            target = target[key]
        target[leaf] = value
    return out


def _run_specs(spec: dict) -> list[tuple[str, dict, object]]:
    """(name, changes, expected) of every run: the sweep's first, then the listed ones."""
    specs = []
    sweep = spec.get("sweep") or {}
    if sweep:
        lengths = {len(values) for values in sweep.values()}
        if len(lengths) != 1:
            raise ValueError(f"sweep: every field needs the same number of values, got {sorted(lengths)}")
        count = lengths.pop()
        expected = spec.get("expected") or [None] * count
        varying = [path for path, values in sweep.items() if len({json.dumps(v) for v in values}) > 1]
        names = spec.get("names") or [",".join(f"{path.split('.')[-1]}={_short(sweep[path][i])}"
                                               for path in varying or list(sweep)) for i in range(count)]
        if len(expected) != count or len(names) != count:
            raise ValueError(f"sweep: `expected` and `names` need one entry per run ({count})")
        specs += [(names[i], {path: values[i] for path, values in sweep.items()}, expected[i]) for i in range(count)]
    for run in spec.get("runs") or []:
        unknown = sorted(set(run) - {"name", "set", "expected"})
        if "name" not in run or unknown:
            raise ValueError(f"runs: each run has `name`, optional `set` and `expected`; got {sorted(run)}")
        specs.append((str(run["name"]), run.get("set") or {}, run.get("expected")))
    names = [name for name, _, _ in specs]
    if not specs or len(set(names)) != len(names):
        raise ValueError(f"a study needs runs (a `sweep` or `runs`) with distinct names, got {names}")
    return specs


def _changed(base: dict, changes: dict) -> dict:
    """A run's changes as shown in the table: as written, except that a section replaced whole shows only the
    fields it sets differently from the base section (not its whole text)."""
    shown = {}
    for path, value in changes.items():
        old = base.get(path)
        if isinstance(value, dict) and isinstance(old, dict):
            shown.update({f"{path}.{leaf}": value[leaf] for leaf in value if old.get(leaf) != value[leaf]})
        else:
            shown[path] = value
    return shown


def _short(value) -> str:
    return "+".join(map(str, value)) if isinstance(value, list) else str(value)


BASE_KEYS = ("model", "data", "sft", "algorithm", "rl", "eval")
STUDY_KEYS = (*BASE_KEYS, "name", "description", "paper", "hardware", "scale", "output_dir", "results", "sweep",
              "expected", "names", "runs", "primary")


def load_study(path: str | Path) -> Study:
    """Read and check a study file: every section's fields exist in its config class, every run resolves. Nothing
    is trained or generated."""
    spec = yaml.safe_load(Path(path).read_text())
    # Keys starting with "_" hold YAML anchors (e.g. one algorithm's `rl` section that runs switch to).
    spec = {key: value for key, value in spec.items() if not key.startswith("_")}
    unknown = sorted(set(spec) - set(STUDY_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; a study has {list(STUDY_KEYS)} (and `_`-prefixed keys "
                         "for YAML anchors)")
    name = spec.get("name") or Path(path).stem
    base = {key: spec.get(key) for key in BASE_KEYS}
    base["data"] = base["data"] or {}
    base["rl"] = base["rl"] or {}
    base["eval"] = base["eval"] or {}
    base["algorithm"] = base["algorithm"] or "none"
    runs = []
    for run_name, changes, expected in _run_specs(spec):
        resolved = _apply(base, changes)
        where = f"{path}, run {run_name!r}"
        algorithm = resolved["algorithm"]
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{where}: algorithm={algorithm!r}; choose one of {sorted(ALGORITHMS)}")
        # With algorithm 'none' the section may still hold the base algorithm's fields (it is not built).
        rl_classes = [ALGORITHMS[algorithm][1]] if algorithm != "none" else [
            config for _, config in ALGORITHMS.values() if config]
        _check_fields(f"{where}: rl", resolved["rl"], *map(_config_class, rl_classes))
        if resolved["sft"] is not None:
            _check_fields(f"{where}: sft", resolved["sft"], _config_class("MultiTurnSFTConfig"))
        if algorithm == "none" and resolved["sft"] is None:
            raise ValueError(f"{where}: no SFT and algorithm 'none' trains nothing; set one of them")
        _check_fields(f"{where}: data", resolved["data"], StudyData)
        _check_fields(f"{where}: eval", resolved["eval"], StudyEval)
        try:
            data = StudyData(**resolved["data"])
            data.check()
            study_eval = StudyEval(**resolved["eval"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if resolved["sft"] is not None and data.num_sft_games == 0:
            raise ValueError(f"{where}: an SFT warm start needs data.num_sft_games > 0")
        if not resolved["model"]:
            raise ValueError(f"{where}: name the starting `model`")
        runs.append(StudyRun(run_name, resolved["model"], data, resolved["sft"], algorithm, resolved["rl"],
                             study_eval, _changed(base, copy.deepcopy(changes)), expected))
    output_dir = Path(spec.get("output_dir") or "outputs/paper")
    results = Path(spec.get("results") or f"benchmarks/results/paper/{name}")
    return Study(name, runs, output_dir, results, spec.get("paper") or "", spec.get("hardware") or "",
                 spec.get("description") or "", _primary(path, spec.get("primary") or [], [run.name for run in runs]))


def _primary(path, entries: list, names: list[str]) -> list[tuple[str, str]]:
    """The study's pre-registered comparisons as (run, versus) pairs, each naming runs of the study."""
    pairs = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != {"run", "versus"}:
            raise ValueError(f"{path}: primary: each comparison is {{run: NAME, versus: start or NAME}}, got "
                             f"{entry!r}")
        run, versus = str(entry["run"]), str(entry["versus"])
        unknown = [name for name in (run, versus) if name not in names and not (name == versus == "start")]
        if unknown or run == versus:
            raise ValueError(f"{path}: primary: {entry!r} must name two different runs of the study (or versus: "
                             f"start); its runs are {names}")
        pairs.append((run, versus))
    if len(set(pairs)) != len(pairs):
        raise ValueError(f"{path}: primary: a comparison is listed twice: {pairs}")
    return pairs


def sft_format(rl: dict) -> dict:
    """The episode format an SFT warm start copies from the `rl` section (unless its own section sets it)."""
    return {k: rl[k] for k in SFT_FORMAT_FIELDS if k in rl}


def build_configs(run: StudyRun, output_dir: Path):
    """(SFT config or None, RL config or None, episode settings) of a run, as the trainers take them, saving to
    `run.stage_dirs(output_dir)`. The SFT config copies the RL config's episode format (system prompt, action
    parser, template arguments) unless it sets its own."""
    sft_config = rl_config = None
    sft_dir, rl_dir = run.stage_dirs(output_dir)
    if run.sft is not None:
        sft_config = _config_class("MultiTurnSFTConfig")(output_dir=str(sft_dir), **{**sft_format(run.rl), **run.sft})
    if run.algorithm != "none":
        rl_config = _config_class(ALGORITHMS[run.algorithm][1])(output_dir=str(rl_dir), **run.rl)
    episode = rl_config if rl_config is not None else SimpleNamespace(**run.rl)
    return sft_config, rl_config, episode


# -- running --------------------------------------------------------------------------------------------------------


class Results:
    """The study's results JSON, rewritten (atomically) after every stage so that a stopped study resumes."""

    def __init__(self, path: Path, study: str):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("study", study)
        self.data.setdefault("sft", {})
        self.data.setdefault("runs", {})

    def save(self) -> None:
        if int(os.environ.get("RANK", "0")) != 0:  # under `accelerate launch`, the main process writes
            return
        _write_json(self.path, self.data)


def _write_json(path: Path, data: dict) -> None:
    """Write `data` to `path` atomically (a reader sees the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    tmp.replace(path)


def _has_checkpoint(path: str | Path) -> bool:
    return (Path(path) / "config.json").is_file()


STAGE_RECORD = "stage.json"  # a finished stage's record, saved beside its checkpoint for other studies to reuse


def _finished_stage(recorded: dict | None, path: Path) -> dict | None:
    """The record of a finished SFT or RL stage whose checkpoint is at `path`: the study's own record, else the one
    another study saved beside the checkpoint (equal keys mean equal inputs); None when it must be trained."""
    if recorded is not None and _has_checkpoint(recorded["path"]):
        return recorded
    if _has_checkpoint(path) and (path / STAGE_RECORD).is_file():
        return json.loads((path / STAGE_RECORD).read_text())
    return None


def _stage(what: str, recorded: dict | None, path: Path, inputs: dict, log, train) -> dict:
    """The record of the SFT or RL stage saved at `path`: reused when finished (`_finished_stage`), else trained by
    `train()` and saved with its `inputs` beside the checkpoint. A study waits while another study on this machine
    trains the same stage (a lock file beside it; not taken under `accelerate launch`, where every rank must train
    together), then reuses it."""
    with _stage_lock(path, lambda: log(f"{what}: waiting for the other study training {path}")):
        done = _finished_stage(recorded, path)
        if done is not None:
            log(f"{what}: checkpoint {done['path']} reused")
            return done
        log(f"{what} -> {path}")
        record = {**train(), "inputs": inputs}
        _write_json(Path(record["path"], STAGE_RECORD), record)
        return record


@contextlib.contextmanager
def _stage_lock(path: Path, on_wait):
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock goes with the file's closing


def _jsonable_log(log: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if isinstance(v, (int, float, str, bool)) or v is None} for entry in log]


def train_sft(config, model: str, tasks, environment_factory) -> dict:
    from .trainers import MultiTurnSFTTrainer

    clock = time.perf_counter()
    trainer = MultiTurnSFTTrainer(model, args=config, environment_factory=environment_factory, train_dataset=tasks)
    result = trainer.train()
    trainer.save_model(config.output_dir)
    return {"path": config.output_dir, "seconds": time.perf_counter() - clock, "steps": trainer.state.global_step,
            "examples": len(tasks), "train_loss": result.training_loss,
            "log": _jsonable_log(trainer.state.log_history)}


def train_rl(algorithm: str, config, model: str, tasks, environment_factory) -> dict:
    clock = time.perf_counter()
    trainer_cls = _config_class(ALGORITHMS[algorithm][0])
    trainer = trainer_cls(model=model, args=config, environment_factory=environment_factory, train_dataset=tasks)
    trainer.train()
    if trainer.state.global_step == 0:
        raise RuntimeError(f"{algorithm} trained no step on {len(tasks)} games: one step needs more games than that "
                           "(per_device_train_batch_size / num_generations per process); raise data.num_train_games "
                           "or lower rl.per_device_train_batch_size")
    trainer.save_model(config.output_dir)
    # Each generated batch is trained on `num_iterations` times (TRL's GRPO machinery; PPO's epochs).
    episodes = (trainer.state.global_step * config.per_device_train_batch_size * config.gradient_accumulation_steps
                * trainer.accelerator.num_processes // getattr(config, "num_iterations", 1))
    return {"path": config.output_dir, "seconds": time.perf_counter() - clock, "steps": trainer.state.global_step,
            "episodes": episodes, "log": _jsonable_log(trainer.state.log_history)}


def evaluate_run(run: StudyRun, model: str, tasks, environment_factory, episode) -> dict:
    from . import evaluation
    from .script_args import evaluation_options

    clock = time.perf_counter()
    result = evaluation.evaluate(model, environment_factory, tasks, temperature=run.eval.temperature,
                                 batch_size=run.eval.batch_size, **evaluation_options(episode, run.eval.max_turns))
    outcomes = {_task_key(ep.task): bool(ep.won) for ep in result.episodes if not ep.failed}
    return {"model": model, "successes": result.successes, "n": result.n, "failed": result.failed,
            "ci_low": result.ci_low, "ci_high": result.ci_high, "mean_turns": result.mean_turns,
            "seconds": time.perf_counter() - clock, "outcomes": outcomes}


def evaluation_key(run: StudyRun, policy: str, tasks, episode) -> str:
    """Digest of what a held-out result depends on: the policy's name, the eval settings, the episode settings and
    the held-out games."""
    from .script_args import evaluation_options

    options = {k: v for k, v in evaluation_options(episode, run.eval.max_turns).items() if k != "progress"}
    settings = {k: v for k, v in dataclasses.asdict(run.eval).items() if k != "start"}
    return _digest({"policy": policy, "eval": settings, "episode": options, "env": run.data.env,
                    "tasks": [_task_key(task) for task in tasks]})[:12]


def _evaluation(study: Study, run: StudyRun, policy: str, model: str, tasks, environment_factory, episode,
                log) -> dict:
    """The held-out result of `model` (named `policy`: a stage folder's name, or the model id without SFT or RL),
    played once for every run of any study that evaluates that policy on the same held-out episodes: saved as
    `<output_dir>/evals/<key>.json`, the key a digest of the policy, the eval settings, the episode settings and the
    held-out games (`tasks`). The record carries its `key`."""
    key = evaluation_key(run, policy, tasks, episode)
    path = study.output_dir / "evals" / f"{key}.json"
    what = f"[{study.name}] {run.name}: {policy} on {len(tasks)} held-out games"
    with _stage_lock(path, lambda: log(f"{what}: waiting for the other study playing them")):
        if path.is_file():
            log(f"{what}: result {path} reused")
            return json.loads(path.read_text())
        log(f"{what}: playing")
        result = {**evaluate_run(run, model, tasks, environment_factory, episode), "key": key}
        _write_json(path, result)
        return result


def _task_key(task: dict) -> str:
    return str(task.get("game_file") or task.get("instance_id") or task.get("seed"))


def run_study(study: Study, only: list[str] | None = None, log=print) -> Results:
    """Run the study's runs in order (or those named in `only`), skipping what the results JSON records."""
    results = Results(study.results.with_suffix(".json"), study.name)
    for run in study.runs:
        if only and run.name not in only:
            continue
        record = results.data["runs"].get(run.name)
        if record is not None and record.get("fingerprint") != run.fingerprint():
            log(f"[{study.name}] {run.name}: settings changed since it was recorded; running it again")
            record = None
        if record is not None and "eval" in record:
            log(f"[{study.name}] {run.name}: done, skipped")
            continue
        record = record or {"fingerprint": run.fingerprint(), "settings": run.settings(), "changed": run.changed,
                            "expected": run.expected}
        results.data["runs"][run.name] = record
        _run_one(study, run, record, results, log)
    write_report(study, results)
    return results


def _run_one(study: Study, run: StudyRun, record: dict, results: Results, log) -> None:
    from .models import resolve_model

    environment_factory = run.data.environment_factory()
    model = resolve_model(run.model)
    key = run.sft_key()
    sft_config, rl_config, episode = build_configs(run, study.output_dir)
    where = f"[{study.name}] {run.name}"
    if sft_config is not None:
        done = _stage(f"{where}: SFT on {run.data.num_sft_games} games", results.data["sft"].get(key),
                      Path(sft_config.output_dir), run.sft_inputs(), log,
                      lambda: train_sft(sft_config, model, run.data.tasks("sft"), environment_factory))
        results.data["sft"][key] = done
        results.save()
        record["sft"] = key
        model = done["path"]
    start_model = model
    if rl_config is not None:
        done = _stage(f"{where}: {run.algorithm.upper()} on {run.data.num_train_games} games", record.get("rl"),
                      Path(rl_config.output_dir), run.rl_inputs(), log,
                      lambda: train_rl(run.algorithm, rl_config, model, run.data.tasks("train"), environment_factory))
        record["rl"] = done
        results.save()
        model = done["path"]
    # The policies by the names of their stages (digests of their inputs), whatever folder holds them.
    start_policy, policy = (stage.name if stage else None for stage in run.stage_dirs(Path()))
    start_policy = start_policy or run.model
    eval_tasks = run.data.tasks("eval")  # the same games for the start and the trained policy
    if run.eval.start and rl_config is not None:
        start = _evaluation(study, run, start_policy, start_model, eval_tasks, environment_factory, episode, log)
        results.data.setdefault("start", {})[start["key"]] = start
        record["start"] = start["key"]
        results.save()
    record["eval"] = _evaluation(study, run, policy or start_policy, model, eval_tasks, environment_factory, episode,
                                 log)
    results.save()
    ev = record["eval"]
    log(f"[{study.name}] {run.name}: {ev['successes']}/{ev['n']} held-out games won")


# -- report ---------------------------------------------------------------------------------------------------------


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
    from .evaluation import mcnemar_exact

    if set(outcomes) != set(other):
        return None
    only_this = sum(outcomes[g] and not other[g] for g in outcomes)
    only_other = sum(other[g] and not outcomes[g] for g in outcomes)
    return {"run": name, "only_this": only_this, "only_other": only_other,
            "p_value": mcnemar_exact(only_this, only_other)}


def primary_comparisons(study: Study, results: Results) -> list[dict]:
    """The study's pre-registered comparisons (`Study.primary`), each with its discordant games, exact McNemar p and
    Holm-adjusted p over all of them (`evaluation.holm`); a comparison whose runs have not both finished (or are
    stale) has no test and counts with p = 1, so adding runs later cannot make the others look stronger."""
    from .evaluation import holm

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
        changed = ", ".join(f"{k}={_short(v)}" for k, v in row["changed"].items()) or "(base)"
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
    import matplotlib

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
    """A table of the paired held-out games each effect needs (exact McNemar, `power.games_for_power`) and the power
    the study's own game count gives, at the discordance stated or else the mean one its results saw. The level is
    alpha / m for the m pre-registered comparisons (Holm's first step; alpha when none is named)."""
    from .power import games_for_power, mcnemar_power

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


# -- command line ---------------------------------------------------------------------------------------------------


def _study_command(args: argparse.Namespace) -> int:
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
    results = run_study(study, args.runs)
    print(markdown_table(study, results.data["table"], results.data["primary"]))
    return 0


def add_study_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "study", help="Run one of the paper's studies (recipes/paper/): SFT -> RL -> held-out evaluation per run.",
        description="trl-multiturn study recipes/paper/<study>.yaml: runs in order, skips the runs (and stages) the "
                    "results JSON records, writes the table (.md, .json) and figure (.png).",
    )
    parser.add_argument("study", type=Path, help="The study file.")
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
    parser.set_defaults(func=_study_command)


def _unit_interval(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number strictly between 0 and 1")
    return value
