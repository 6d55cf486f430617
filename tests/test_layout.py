"""The package layout: one package per environment, and the old public names the README documents still resolve
to the moved objects (the rollout loop's deprecated class name warns)."""

import importlib
import subprocess
import sys
import warnings

import pytest


def test_readme_import_paths_resolve_to_the_moved_objects():
    from trl_multiturn.data import textworld_tasks
    from trl_multiturn.envs import TextWorldEnv
    from trl_multiturn.envs.alfworld.generator import generate_games
    from trl_multiturn.envs.alfworld_gen import generate_games as old_generate_games
    from trl_multiturn.envs.textworld.env import TextWorldEnv as moved_env
    from trl_multiturn.envs.textworld.tasks import textworld_tasks as moved_tasks

    assert textworld_tasks is moved_tasks and TextWorldEnv is moved_env and old_generate_games is generate_games


def test_saved_episode_settings_still_name_the_textworld_class():
    # episode_settings.json files written before the move name "trl_multiturn.envs.textworld:TextWorldEnv".
    from trl_multiturn.envs.textworld.env import TextWorldEnv

    assert importlib.import_module("trl_multiturn.envs.textworld").TextWorldEnv is TextWorldEnv


def test_textworld_script_arguments_do_not_import_the_engine():
    # `trl-multiturn train --help` parses TextWorldScriptArguments; the engine is only imported when games are made.
    code = ("import sys; from trl_multiturn.commands.script_args import TextWorldScriptArguments; "
            "TextWorldScriptArguments(); print('textworld' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_deprecated_rollout_class_name_warns_and_is_the_episode_runner(tiny_chatml_model):
    from toy_envs import CountingEnv
    from transformers import AutoTokenizer

    from trl_multiturn import EpisodeRunner, MultiTurnRolloutCollator

    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    with pytest.warns(DeprecationWarning, match="EpisodeRunner"):
        old = MultiTurnRolloutCollator(CountingEnv, tokenizer, lambda contexts, n: ([[]] * len(contexts), None),
                                       max_turns=1, max_reply_tokens=2)
    assert isinstance(old, EpisodeRunner)
    old.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EpisodeRunner(CountingEnv, tokenizer, lambda contexts, n: ([[]] * len(contexts), None), max_turns=1,
                      max_reply_tokens=2).close()
