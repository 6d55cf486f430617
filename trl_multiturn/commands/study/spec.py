"""The study file's schema: which tasks (`StudyData`), how the held-out games are played (`StudyEval`), one run
(`StudyRun`, with the digests that name its stages), and `load_study`, which resolves a file's sweep and runs and
checks every field before anything runs."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from ...config_checks import Range, check_fields, config_field, field_like
from ...envs.suites import SUITES
from ...rollout.rules import RULES
from ...trainers.sft import MultiTurnSFTConfig
from ..script_args import EnvArguments, TextWorldScriptArguments
from ..train import RL_ALGORITHMS, config_class

ALGORITHMS = (*RL_ALGORITHMS, "none")  # none: pure SFT; `rl` then only gives the held-out episodes their settings
RUNNER_FIELDS = ("output_dir",)  # set by the runner for every stage; a study does not set them
# StudyData fields that only the held-out games read: runs differing in them share an RL checkpoint.
EVAL_DATA_FIELDS = ("num_eval_games", "eval_shapes", "eval_task_types", "eval_split", "eval_tiers")
# ... and those that only the RL and held-out games read: runs differing in them share an SFT checkpoint.
RL_EVAL_DATA_FIELDS = ("num_train_games", *EVAL_DATA_FIELDS)
# The rules of play an SFT config has: copied from `rl` into the SFT config unless its own section sets them.
SFT_FORMAT_FIELDS = tuple(f.name for f in dataclasses.fields(MultiTurnSFTConfig) if f.name in RULES)


@dataclass
class StudyData:
    """Which games a study's runs train and evaluate on."""

    env: str = field(
        default="textworld",
        metadata={"help": "The environment: a registered suite (trl_multiturn.envs.suites: textworld, alfworld, "
                          "swegym, or one of your own)."},
    )
    train_shapes: list[str] = field(
        default_factory=lambda: ["w2-o3-q4"],
        metadata={"help": "TextWorld: the shapes of the training games (w<rooms>-o<objects>-q<quest length>); "
                          "several give a mixture in equal parts."},
    )
    eval_shapes: list[str] | None = field(
        default=None, metadata={"help": "TextWorld: shapes of the held-out games (default: train_shapes)."}
    )
    challenge: str | None = field_like(TextWorldScriptArguments, "challenge")
    challenge_rewards: str = field_like(TextWorldScriptArguments, "challenge_rewards")
    challenge_goal: str = field_like(TextWorldScriptArguments, "challenge_goal")
    task_types: list[str] | None = field(
        default=None, metadata={"help": "ALFWorld: task types to train on (default: all six)."}
    )
    eval_task_types: list[str] | None = field(
        default=None, metadata={"help": "ALFWorld: task types of the held-out games (default: all six)."}
    )
    eval_split: str = field_like(EnvArguments, "eval_split")
    data_path: str | None = field(
        default=None, metadata={"help": "ALFWorld: the downloaded games ($ALFWORLD_DATA); none: generated."}
    )
    num_train_games: int | None = field_like(TextWorldScriptArguments, "num_train_games")  # TextWorld: from seed 0
    num_eval_games: int | None = field_like(TextWorldScriptArguments, "num_eval_games")
    num_sft_games: int | None = config_field(
        0, "Games whose expert walkthroughs SFT trains on (SWE-Gym: the gold patches of the first training tasks). "
           "ALFWorld, SWE-Gym: None for all.", range=Range(ge=0))
    sft_first_game: int = config_field(
        500_000, "TextWorld: index of the first SFT game in the train split's seeds, so that SFT games never "
                 "overlap the RL games (0 .. num_train_games - 1). ALFWorld's SFT replays the experts of its "
                 "training games, as the paper does.", range=Range(ge=0))
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
    held_out_fraction: float = field_like(EnvArguments, "held_out_fraction")
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

    def __post_init__(self):
        check_fields(self)

    def count(self, part: str) -> int | None:
        """How many tasks `part` ("train": RL, "sft" or "eval") has."""
        return {"train": self.num_train_games, "sft": self.num_sft_games, "eval": self.num_eval_games}[part]

    def check(self) -> None:
        suite = SUITES.lookup(self.env)
        if suite.check is not None:
            suite.check(self)

    def tasks(self, part: str):
        """The task rows of `part`: "train" (RL), "sft" or "eval" (held out), by the suite's rule."""
        return SUITES.lookup(self.env).tasks(self, part)

    def environment_factory(self):
        suite = SUITES.lookup(self.env)
        return suite.factory(**suite.selection_settings(self))


@dataclass
class StudyEval:
    """How the held-out games are played (the rest of an episode's settings come from the `rl` section)."""

    temperature: float = field_like(TextWorldScriptArguments, "eval_temperature")
    max_turns: int | None = field_like(TextWorldScriptArguments, "eval_max_turns")
    batch_size: int = config_field(16, "Episodes played at once.", range=Range(ge=1))
    start: bool = field(
        default=True,
        metadata={"help": "Also play the held-out games with the run's starting policy (its SFT checkpoint, or the "
                          "model itself without SFT), so the table shows what RL added, with a paired test. Runs "
                          "whose start and held-out episodes are equal share one such evaluation."},
    )

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
        return digest(self.settings())

    def sft_inputs(self) -> dict | None:
        """Everything the run's SFT checkpoint depends on: the starting model, the SFT config with the episode
        format it copies from `rl`, and every `data` field except those only the RL and held-out games read
        (`RL_EVAL_DATA_FIELDS`), so that a data field added later keeps runs apart until it is listed there."""
        if self.sft is None:
            return None
        data = {k: v for k, v in dataclasses.asdict(self.data).items() if k not in RL_EVAL_DATA_FIELDS}
        data["swegym"] = {k: v for k, v in data["swegym"].items() if k not in SUITES[self.data.env].sft_ignores}
        return {"model": self.model, "data": data, "sft": {**sft_format(self.rl), **self.sft}}

    def sft_key(self) -> str | None:
        """Runs with equal `sft_inputs` share one SFT checkpoint (trained once, reused by the others)."""
        inputs = self.sft_inputs()
        return None if inputs is None else digest(inputs)[:12]

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
        return None if inputs is None else digest(inputs)[:12]

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


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


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
        names = spec.get("names") or [",".join(f"{path.split('.')[-1]}={short(sweep[path][i])}"
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


def short(value) -> str:
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
        rl_algorithms = [algorithm] if algorithm != "none" else RL_ALGORITHMS
        _check_fields(f"{where}: rl", resolved["rl"], *map(config_class, rl_algorithms))
        if resolved["sft"] is not None:
            _check_fields(f"{where}: sft", resolved["sft"], MultiTurnSFTConfig)
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
        sft_config = MultiTurnSFTConfig(output_dir=str(sft_dir), **{**sft_format(run.rl), **run.sft})
    if run.algorithm != "none":
        rl_config = config_class(run.algorithm)(output_dir=str(rl_dir), **run.rl)
    episode = rl_config if rl_config is not None else SimpleNamespace(**run.rl)
    return sft_config, rl_config, episode
