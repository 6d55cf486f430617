"""The model card trl-multiturn's trainers write (README.md beside the saved model, uploaded by `push_to_hub`).

It names the real base model (a Hub id, also when the model was loaded from a local folder: the offline default, or
a checkpoint whose own card names its base) and the whole lineage (base -> SFT -> RL, each trl-multiturn stage with
its algorithm and steps, read back from the parent's card), the environment and its settings, the recipe, the
algorithm, the reward mode and advantage estimator, the episode settings, and every held-out evaluation kept in the
folder (also as the metadata's `model-index`). A LoRA adapter's card says `library_name: peft`. Paths inside the
cache are written relative to it (`<cache>/...`), paths under the working folder relative to that, so a card says
nothing about the machine it was written on.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .cache import cache_root
from .episode_settings import load_episode_settings
from .rollout.rules import RULES

TRAINING_FIELDS = ("reward_mode", "success_reward", "format_penalty", "turn_gamma", "advantage_estimator",
                   "estimator_kwargs", "loss_type", "beta", "num_generations", "learning_rate",
                   "per_device_train_batch_size", "gradient_accumulation_steps", "temperature", "max_steps", "seed")
EPISODE_ROWS = RULES  # every rule of play (`trl_multiturn.rollout.rules.EpisodeRules`)
START_EVAL_RESULTS_FILE = "start_eval_results.json"
"""The starting model's held-out evaluation, played on the same tasks before training (`eval_start_model`); not an
`eval_results_*` file, which are evaluations of the trained model. The card and the episodes page show it beside
them."""


def load_start_result(folder: str | os.PathLike | None) -> dict | None:
    """The starting model's evaluation kept in `folder` (`START_EVAL_RESULTS_FILE`, with "file" set), or None."""
    path = Path(folder) / START_EVAL_RESULTS_FILE if folder else None
    if path is None or not path.is_file():
        return None
    return {**json.loads(path.read_text()), "file": path.name}


def base_model_name(name_or_path: str | os.PathLike | None) -> str | None:
    """The Hub id a model came from: a Hub id as given; for a local folder, SmolLM2-135M-Instruct when it is the
    offline default's converted copy, else the `base_model` its own model card names (a trl-multiturn checkpoint
    names its base); None when a local folder says nothing."""
    from .models import OFFLINE_DEFAULT_HUB_ID, OFFLINE_DEFAULT_MODEL, offline_default_dir

    if not name_or_path:
        return None
    if str(name_or_path) == OFFLINE_DEFAULT_MODEL:
        return OFFLINE_DEFAULT_HUB_ID
    path = Path(name_or_path)
    if not path.is_dir():
        return str(name_or_path)
    if path.resolve() == offline_default_dir().resolve():
        return OFFLINE_DEFAULT_HUB_ID
    data = _card_data(path)
    base = data.base_model if data is not None else None
    return base[0] if isinstance(base, list) and base else base


def _card_data(path: Path) -> ModelCardData | None:
    """The metadata of the model card in folder `path`; None without one, or when its metadata is not valid YAML."""
    readme = path / "README.md"
    if not readme.is_file():
        return None
    try:
        return ModelCard.load(readme).data
    except (ValueError, yaml.YAMLError):
        return None


def parent_lineage(name_or_path: str | os.PathLike | None) -> list[dict]:
    """The stages a model loaded from `name_or_path` went through, root first: `[{"model": hub_id}]` for a Hub
    model (or the offline default), the `lineage` a trl-multiturn checkpoint's card records (that checkpoint last),
    `[{"model": base}]` for a folder whose card only names its base, `[]` for a bare local folder."""
    if not name_or_path:
        return []
    path = Path(name_or_path)
    data = _card_data(path) if path.is_dir() else None
    recorded = getattr(data, "lineage", None) if data is not None else None
    if isinstance(recorded, list) and all(isinstance(stage, dict) and "model" in stage for stage in recorded):
        return recorded
    base = base_model_name(name_or_path)
    return [{"model": base}] if base else []


def display_path(value):
    """`value` as a card shows it: an absolute path inside the trl-multiturn cache as `<cache>/relative`, one under
    the working folder relative to it; anything else unchanged."""
    if not isinstance(value, str) or not os.path.isabs(value):
        return value
    path = Path(value)
    for root, shown in ((cache_root(), "<cache>"), (Path.cwd(), ".")):
        try:
            return f"{shown}/{path.resolve().relative_to(root.resolve())}"
        except ValueError:
            continue
    return value


def _folder_ref(folder: str) -> str:
    """How the card's "Evaluate it" command names the model's folder: `display_path`, or its name when it lies
    outside the cache and the working folder (the machine's own path says nothing to a reader)."""
    shown = display_path(folder)
    return Path(folder).name if shown == folder and os.path.isabs(folder) else shown


def recipe_from_argv(argv: list[str] | None = None) -> str | None:
    """The `--config FILE` of the command line that started this process, if any. Read from `sys.orig_argv` (the
    command line as the interpreter received it), not `sys.argv`: fast_downward, ALFWorld's planner, overwrites
    `sys.argv` whenever a game is loaded in this process."""
    argv = sys.orig_argv if argv is None else argv
    return argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _cell(value) -> str:
    return "`" + str(value).replace("|", "\\|").replace("\n", " ") + "`"


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _percent(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def evaluation_table(summary: dict) -> str:
    """Markdown table of an `eval_results.json` summary: all tasks, then each group of each `by_<column>`."""
    rows = [("all", summary)]
    for key, groups in summary.items():
        if key.startswith("by_"):
            rows += [(f"{key[3:]}={value}", group) for value, group in groups.items()]
    return _table(("tasks", "success", "95% CI", "episodes", "mean turns", "mean return", "failed"), [
        (name, _percent(s["success_rate"]), f"{_percent(s['ci_low'])} - {_percent(s['ci_high'])}", s["n"],
         f"{s['mean_turns']:.2f}", f"{s['mean_return']:.3f}", s["failed"]) for name, s in rows])


def evaluation_section(eval_results: list[dict], start: dict | None = None) -> str:
    """The card's "## Evaluation" section: one paragraph and table per kept evaluation (`load_eval_results`), then
    the starting model's on the same tasks (`load_start_result`) when there is one."""
    parts = ["## Evaluation"]
    for record in eval_results:
        played = record.get("settings") or {}
        how = "greedily" if not played.get("temperature") else f"at temperature {played['temperature']}"
        where = ", ".join(str(record[key]) for key in ("env", "split", "tasks") if record.get(key))
        source = record.get("file", "eval_results.json")
        parts.append(f"Held-out tasks{f' ({where})' if where else ''}, played {how} with at most "
                     f"{played.get('max_turns', '?')} turns (`{source}` holds every task's outcome).\n\n"
                     + evaluation_table(record["summary"]))
    if start is not None:
        summary = start["summary"]
        parts.append(f"The starting model (`{display_path(start.get('model'))}`) on the same held-out tasks before "
                     f"training: {summary['successes']}/{summary['n']} won ({_percent(summary['success_rate'])}; "
                     f"`{start['file']}` holds every task's outcome).")
    return "\n\n".join(parts)


def model_index(eval_results: list[dict], env_name: str) -> list[EvalResult] | None:
    """The metadata's `model-index` entries: the success rate of each kept held-out evaluation (of `env_name`
    unless the record names its environment)."""
    entries = []
    for record in eval_results:
        env = str(record.get("env") or env_name)
        where = ", ".join(str(record[key]) for key in ("split", "tasks") if record.get(key))
        entries.append(EvalResult(task_type="reinforcement-learning", dataset_type=env,
                                  dataset_name=f"{env} held-out tasks" + (f" ({where})" if where else ""),
                                  dataset_split=record.get("split"), metric_type="success_rate",
                                  metric_name="held-out success rate",
                                  metric_value=float(record["summary"]["success_rate"])))
    return entries or None


def update_card_evaluation(folder: str | os.PathLike) -> bool:
    """Rewrite the evaluation section and the `model-index` of the trl-multiturn model card in `folder` from every
    evaluation kept there (the section replaced, or added before "## Evaluate it"); False, and nothing written,
    when the folder has no such card."""
    from .evaluation import load_eval_results

    eval_results = load_eval_results(folder)
    readme = Path(folder) / "README.md"
    if not readme.is_file():
        return False
    card = ModelCard.load(readme)
    if "\n## Evaluate it\n" not in card.text or "trl-multiturn" not in card.text:
        return False
    head, _, tail = card.text.partition("\n## Evaluate it\n")
    head = head.split("\n## Evaluation\n")[0].rstrip("\n")
    environment = (load_episode_settings(folder).get("environment") or {})
    card.data.eval_results = model_index(eval_results, environment.get("name") or "unknown")
    card.data.model_name = card.data.model_name or Path(folder).name
    card.text = f"{head}\n\n{evaluation_section(eval_results, load_start_result(folder))}\n\n## Evaluate it\n{tail}"
    card.save(readme)
    return True


def training_tasks(tasks: dict) -> str:
    """The card's "training tasks" cell: how many task rows, and each kind of task among them (`task_distribution`:
    TextWorld's game shape, ALFWorld's task type, SWE-Gym's tier)."""
    kinds = "; ".join(", ".join(f"{key}={value}" for key, value in shape.items()) for shape in tasks.get("shapes", []))
    return f"{tasks.get('num_tasks', '?')} tasks" + (f" ({_cell(kinds)})" if kinds else "")


def _stage(stage: dict) -> str:
    """One earlier trl-multiturn stage of a lineage, as the card's first sentence names it."""
    return f"{stage.get('algorithm', 'training')} (`{stage['model']}`, {stage.get('steps', '?')} steps)"


def build_model_card(*, model_name: str, trainer_name: str, base_model: str | None, local_base: str | None,
                     args, settings: dict, global_step: int, recipe: str | None = None,
                     eval_results: list[dict] | None = None, hub_model_id: str | None = None,
                     dataset_name: str | None = None, tags: list[str] | None = None,
                     folder: str | None = None) -> ModelCard:
    """The card's text and metadata; see the module docstring."""
    algorithm = trainer_name.removeprefix("MultiTurn").removesuffix("Trainer")
    environment = settings.get("environment") or {}
    env_name = environment.get("name") or environment.get("class") or "unknown"
    adapter = folder is not None and (Path(folder) / "adapter_config.json").is_file()
    parents = parent_lineage(local_base)
    card_data = ModelCardData(
        base_model=base_model, datasets=dataset_name, library_name="peft" if adapter else "transformers",
        model_name=model_name, eval_results=model_index(eval_results or [], str(env_name)),
        lineage=parents + [{"model": model_name, "algorithm": algorithm, "steps": global_step}],
        tags=sorted({"trl", "trl-multiturn", "multi-turn", "reinforcement-learning", algorithm.lower(),
                     str(env_name), *(tags or [])}),
    )
    stages = [_stage(stage) for stage in parents if "algorithm" in stage]
    if base_model:
        origin = f"[{base_model}](https://huggingface.co/{base_model})"
    elif stages:
        origin = "a local model"
    else:
        origin = f"a local model (`{display_path(local_base)}`)" if local_base else "a model built in memory"
    through = f", through {' then '.join(stages)}," if stages else ""
    training = [("algorithm", f"{algorithm} (`{trainer_name}`)"), ("environment", _cell(env_name)),
                ("recipe", _cell(recipe) if recipe else "none (arguments in code)"),
                ("steps trained", global_step)]
    if environment.get("settings"):
        shown = {key: display_path(value) for key, value in environment["settings"].items()}
        training.append(("environment settings", _cell(shown)))
    if settings.get("tasks"):
        training.append(("training tasks", training_tasks(settings["tasks"])))
    training += [(name, _cell(getattr(args, name))) for name in TRAINING_FIELDS if hasattr(args, name)]
    episode = [(name, _cell(settings[name])) for name in EPISODE_ROWS if name in settings]
    sections = [
        f"# {model_name}",
        f"This model is a fine-tuned version of {origin}{through} trained with multi-turn {algorithm} "
        f"{'as a LoRA adapter ' if adapter else ''}"
        f"(trl-multiturn, on [TRL](https://github.com/huggingface/trl)) to play whole episodes of the "
        f"`{env_name}` environment turn by turn.",
        "## Training\n\n" + _table(("setting", "value"), training),
        "## Episodes\n\nEvery episode was played with these settings; they are saved in `episode_settings.json` "
        "beside the weights, and `trl-multiturn eval` reads them back.\n\n" + _table(("setting", "value"), episode),
    ]
    start = load_start_result(folder)
    if eval_results or start:
        sections.append(evaluation_section(eval_results or [], start))
    model_ref = hub_model_id or (_folder_ref(folder) if folder else model_name)
    sections.append(
        "## Evaluate it\n\n```bash\n"
        f"trl-multiturn eval --model_name_or_path {model_ref} --num_eval_games 50\n```\n\nIt plays with the "
        "episode settings and environment above (`episode_settings.json`); any of them can be given instead.")
    sections.append("## Framework versions\n\n" + "\n".join(
        f"- {package}: {_version(package)}" for package in ("trl-multiturn", "trl", "transformers", "torch")))
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")
