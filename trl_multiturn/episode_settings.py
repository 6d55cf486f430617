"""How a model played its episodes in training, saved with every checkpoint so that evaluation plays them the same way.

Each saved model folder (`save_model`, every `checkpoint-N`) holds `episode_settings.json`: every rule of play
(`trl_multiturn.rollout.rules.EpisodeRules.to_dict`), the environment and the training tasks:

    {"max_turns": 4, "max_completion_length": 12, "max_episode_tokens": 1024, "max_observation_tokens": 8192,
     "system_prompt": "...", "action_parser": "first_line", "chat_template_kwargs": null,
     "episode_format": "trajectory", "history": "full",
     "environment": {"name": "textworld", "class": "trl_multiturn.envs.textworld:TextWorldEnv",
                     "settings": {"games_dir": "...", ...}},
     "tasks": {"num_tasks": 8, "shapes": [{"world_size": 1, "nb_objects": 2, "quest_length": 2}]}}

`tasks` is the training distribution (`task_distribution`), which `trl-multiturn eval` plays unless told otherwise.

`evaluation.evaluate` (and so `trl-multiturn eval`, `play` and `study`) plays by the rules read back whole
(`saved_rules`); rules given explicitly replace them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from pathlib import Path

from huggingface_hub import hf_hub_download

from .envs.base import Environment
from .envs.suites import SUITES, load_entry_point, suite_of_class
from .rollout.rules import EpisodeRules

logger = logging.getLogger(__name__)

EPISODE_SETTINGS_FILE = "episode_settings.json"


def _json_value(value):
    """`value` as JSON data (paths as strings), or raise TypeError."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    json.dumps(value)
    return value


def environment_spec(environment_factory) -> dict | None:
    """What can be said of an environment factory in JSON: its class and the settings it was bound with.

    `functools.partial(ALFWorldEnv, ALFWorldConfig(admissible_commands=True))` gives
    `{"name": "alfworld", "class": "trl_multiturn.envs.alfworld.env:ALFWorldEnv", "settings": {...}}`: a dataclass
    config given positionally is spread into its fields, keywords are kept. Settings that are not JSON data are
    left out (logged). A lambda or other function gives its qualified name only; None gives None."""
    if environment_factory is None:
        return None
    settings: dict = {}
    factory = environment_factory
    while isinstance(factory, functools.partial):
        bound = {}
        for arg in factory.args:
            if dataclasses.is_dataclass(arg) and not isinstance(arg, type):
                bound.update(dataclasses.asdict(arg))
        settings = {**bound, **factory.keywords, **settings}
        factory = factory.func
    qualname = getattr(factory, "__qualname__", type(factory).__qualname__)  # an instance (AgentEnvironment): class
    spec = {"class": f"{factory.__module__}:{qualname}"}
    if isinstance(factory, type):
        spec["name"] = suite_of_class(factory) or factory.__name__
    kept = {}
    for key, value in settings.items():
        try:
            kept[key] = _json_value(value)
        except TypeError:
            logger.info("episode settings: environment setting %r is not JSON data; not saved", key)
    spec["settings"] = kept
    return spec


SHAPE_COLUMNS = ("world_size", "nb_objects", "quest_length", "challenge", "task_type", "tier")
"""Task-row columns that say what kind of task a row is (TextWorld's game shape, ALFWorld's task type, SWE-Gym's
tier): the training distribution is the set of their distinct combinations."""
MAX_SHAPES = 32


def task_distribution(dataset) -> dict | None:
    """`{"num_tasks": n, "shapes": [...]}`: the distinct combinations of the `SHAPE_COLUMNS` a task dataset has (at
    most `MAX_SHAPES`, in first-seen order; none when it has none of them). None for no dataset or an iterable one."""
    if dataset is None or not hasattr(dataset, "column_names") or not hasattr(dataset, "__len__"):
        return None
    columns = [c for c in SHAPE_COLUMNS if c in dataset.column_names]
    shapes: list[dict] = []
    for row in zip(*(dataset[c] for c in columns)) if columns else ():
        shape = dict(zip(columns, row))
        if shape not in shapes:
            shapes.append(shape)
        if len(shapes) == MAX_SHAPES:
            break
    return {"num_tasks": len(dataset), "shapes": shapes}


def episode_settings(args, environment_factory=None, tasks: dict | None = None) -> dict:
    """A trainer config's rules of play (`EpisodeRules.from_config`), the environment's spec and the training tasks'
    distribution (`task_distribution`)."""
    return {**EpisodeRules.from_config(args).to_dict(), "environment": environment_spec(environment_factory),
            "tasks": tasks}


def save_episode_settings(output_dir: str | os.PathLike, settings: dict) -> Path:
    path = Path(output_dir) / EPISODE_SETTINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")
    return path


def load_episode_settings(model: str | os.PathLike | None) -> dict:
    """The settings saved with `model`: in its folder, or for a Hub id in its repository (from the Hub or its
    cache); {} when there are none or they cannot be reached."""
    if model is None:
        return {}
    path = Path(model) / EPISODE_SETTINGS_FILE
    if not path.is_file():
        if Path(model).exists() or str(model).count("/") != 1:
            return {}
        try:
            path = Path(hf_hub_download(str(model), EPISODE_SETTINGS_FILE))
        except Exception as exc:  # no such file or repository, offline, no network: play with the defaults
            logger.info("no %s for %s (%s)", EPISODE_SETTINGS_FILE, model, type(exc).__name__)
            return {}
    return json.loads(path.read_text())


def saved_rules(settings: dict | str | os.PathLike | None) -> EpisodeRules:
    """The rules a model was trained by: from its episode settings (the dict `load_episode_settings` read, or the
    model folder or Hub id to read them from); the defaults where none were saved."""
    if not isinstance(settings, dict):
        settings = load_episode_settings(settings)
    return EpisodeRules.from_dict(settings)


def saved_suite(spec: dict | None) -> str | None:
    """The registered suite that plays the environment a saved spec describes, found by its import path (`class`):
    the suite whose entry point names that class (as defined or re-exported), so a model trained on a user's
    environment before its suite was registered (the spec then holds its class name) is still matched. By the saved
    name when the class cannot be imported; None when no suite plays it."""
    spec = spec or {}
    target = spec.get("class")
    if target:
        try:
            cls = load_entry_point(target)
        except (ImportError, AttributeError):
            cls = None
        if isinstance(cls, type):
            return suite_of_class(cls)
    return spec.get("name") if spec.get("name") in SUITES else None


def saved_environment_settings(spec: dict | None, name: str | None = None) -> dict:
    """The environment settings a spec saved, when it describes suite `name` (`saved_suite`; all of them for
    None); {} else."""
    spec = spec or {}
    return dict(spec.get("settings") or {}) if name is None or saved_suite(spec) == name else {}


def environment_factory_from_spec(spec: dict | None, name: str | None = None, **overrides):
    """A factory for the environment a spec describes (`name` picks a registered suite, `envs.suites.SUITES`,
    instead of the spec's class); `overrides` replace saved settings. Only `Environment` subclasses are rebuilt."""
    spec = spec or {}
    settings = {**saved_environment_settings(spec, name), **overrides}
    if name is not None:
        return SUITES.lookup(name).factory(**settings)
    target = spec.get("class")
    if target is None:
        raise ValueError(f"no environment: pass `env` (one of {sorted(SUITES)}); the model folder has no "
                         f"{EPISODE_SETTINGS_FILE} naming one")
    cls = load_entry_point(target)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"{target} (from {EPISODE_SETTINGS_FILE}) is not an Environment class; pass `env`")
    return functools.partial(cls, **settings)
