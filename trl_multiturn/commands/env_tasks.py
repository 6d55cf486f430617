"""The environment and the tasks `trl-multiturn train` and `eval` play: a registered suite
(`trl_multiturn.envs.suites`), its settings from the arguments, and its tasks by the suite's own rule (the study's
`StudyData`), so that the held-out tasks of a training run are those `eval` plays afterwards."""

from __future__ import annotations

import functools
import json

from ..envs.suites import SUITES
from .script_args import EnvArguments, TextWorldScriptArguments
from .study.spec import StudyData
from .train import train_on_tasks, train_on_textworld

SHAPE_FIELDS = ("world_size", "nb_objects", "quest_length")
"""TextWorld's game shape: `TextWorldScriptArguments` fields and task-row columns alike."""


def shape_name(shape: dict) -> str:
    return "w{world_size}-o{nb_objects}-q{quest_length}".format(**shape)


def task_selection(env: str, part: str, script_args: TextWorldScriptArguments, env_args: EnvArguments,
                   settings: dict) -> StudyData:
    """The study `data` whose `part` tasks ("train" or "eval": held out) these arguments ask for (`settings`: the
    environment's; the other part keeps the study's default count, never played), so that `trl-multiturn train` and
    `eval` pick tasks by one rule."""
    shape = None if script_args.challenge else shape_name({k: getattr(script_args, k) for k in SHAPE_FIELDS})
    games_dir = env_args.alfworld_games_dir if env == "alfworld" else script_args.games_dir
    count = {"train": {"num_train_games": script_args.num_train_games},
             "eval": {"num_eval_games": script_args.num_eval_games}}[part]
    return StudyData(
        env=env, **count, train_shapes=[shape] if shape else ["w2-o3-q4"], challenge=script_args.challenge,
        challenge_rewards=script_args.challenge_rewards, challenge_goal=script_args.challenge_goal,
        games_dir=games_dir, task_types=env_args.task_types, eval_task_types=env_args.task_types,
        eval_split=env_args.eval_split, data_path=env_args.data_path or settings.get("data_path"),
        swegym_dataset=env_args.dataset_name, swegym_split=env_args.dataset_split,
        held_out_fraction=env_args.held_out_fraction, tiers=env_args.tiers, eval_tiers=env_args.tiers)


def suite_tasks(env: str, part: str, script_args: TextWorldScriptArguments, env_args: EnvArguments, settings: dict):
    """The task rows of `part` ("train", or "eval": `num_eval_games` held-out tasks) of `env` by its suite's rule
    (`settings`: the environment's)."""
    data = task_selection(env, part, script_args, env_args, settings)
    data.check()
    return data.tasks(part)


def environment_overrides(env: str, script_args: TextWorldScriptArguments, env_args: EnvArguments) -> dict:
    """The settings of environment `env` these arguments give: `env_settings` (JSON), and the common flags
    (games_dir, data_path, admissible_commands) under the environment's own names (`Suite.aliases`)."""
    overrides = json.loads(env_args.env_settings) if env_args.env_settings else {}
    given = {"games_dir": script_args.games_dir, "data_path": env_args.data_path,
             "admissible_commands": script_args.admissible_commands or None}
    aliases = SUITES[env].aliases
    for common, value in given.items():
        if value is not None and common in aliases:
            overrides.setdefault(aliases[common], value)
    return overrides


def train_on_env(trainer_cls, script_args: TextWorldScriptArguments, env_args: EnvArguments, training_args,
                 model_args=None, **trainer_kwargs):
    """What `trl-multiturn train --env ENV` does: `train.train_on_tasks` with the suite's environment factory and
    the settings the arguments give (`environment_overrides`; the trainer saves them in episode_settings.json, so
    that `trl-multiturn eval` plays the same environment). TextWorld's games are `train.train_on_textworld`'s (from
    `first_train_game`); any other suite's come from its own rule (`suite_tasks`), so its held-out tasks are those
    `trl-multiturn eval` plays afterwards. Returns the trainer."""
    env = env_args.env or "textworld"
    settings = environment_overrides(env, script_args, env_args)
    factory = SUITES[env].factory(**settings)
    if env == "textworld":
        return train_on_textworld(trainer_cls, script_args, training_args, model_args, factory, **trainer_kwargs)
    return train_on_tasks(trainer_cls, script_args, training_args, model_args, factory,
                          suite_tasks(env, "train", script_args, env_args, settings),
                          functools.partial(suite_tasks, env, "eval", script_args, env_args, settings), env=env,
                          **trainer_kwargs)
