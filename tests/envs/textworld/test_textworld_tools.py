"""examples/textworld_tools.py: TextWorld commands as tools, played through ToolEnvironment."""

import functools
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from trl_multiturn.envs.textworld.env import TextWorldEnv
from trl_multiturn.envs.tools import ToolEnvironment, tool_schemas

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")
ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = runpy.run_path(str(ROOT / "examples" / "textworld_tools.py"), run_name="example")


def test_playing_the_walkthrough_as_tool_calls_wins_with_the_games_rewards(textworld_train_tasks,
                                                                            textworld_games_dir):
    factory = functools.partial(EXAMPLE["TextWorldTools"], games_dir=str(textworld_games_dir))
    env, plain = ToolEnvironment(factory), TextWorldEnv(games_dir=str(textworld_games_dir))
    for task in textworld_train_tasks:
        commands = plain.expert_actions(task)
        assert env.reset(task) == plain.reset(task)
        for k, command in enumerate(commands):
            call = EXAMPLE["command_as_tool_call"](command)
            result, expected = env.step(json.dumps([call])), plain.step(command)
            assert (result.observation, result.reward, result.done) == (expected.observation, expected.reward,
                                                                        expected.done)
        assert result.done and result.won and k == len(commands) - 1
    env.close()
    plain.close()


def test_the_tools_are_the_commands_with_schemas_from_their_docstrings(textworld_games_dir):
    schemas = {s["function"]["name"]: s["function"] for s in
               tool_schemas(functools.partial(EXAMPLE["TextWorldTools"], games_dir=str(textworld_games_dir)))}
    assert {"go", "take", "drop", "open", "close", "unlock", "put", "insert", "look", "inventory"} <= set(schemas)
    assert schemas["take"]["parameters"]["required"] == ["item"]
    assert schemas["unlock"]["parameters"]["required"] == ["target", "key"]


def test_the_example_trains_a_tool_calling_model(tiny_chatml_model, tmp_path, textworld_games_dir):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    cmd = [sys.executable, str(ROOT / "examples" / "textworld_tools.py"),
           "--config", str(ROOT / "recipes/quickstart.yaml"), "--model_name_or_path", tiny_chatml_model,
           "--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--num_train_games", "2", "--num_eval_games",
           "1", "--games_dir", str(textworld_games_dir), "--world_size", "2", "--nb_objects", "3", "--quest_length",
           "4", "--disable_tqdm", "true", "--report_to", "none", "--max_turns", "2",
           "--max_episode_tokens", "4000"]  # the tiny tokenizer spends 3332 tokens on the tool schemas
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out greedy evaluation on 1 test games: success" in done.stdout
    settings = json.loads((tmp_path / "out" / "episode_settings.json").read_text())
    assert settings["action_parser"] == "tool_calls"
    assert "go" in {tool["function"]["name"] for tool in settings["chat_template_kwargs"]["tools"]}


def test_a_meta_command_smuggled_into_a_tool_argument_earns_nothing(textworld_train_tasks, textworld_games_dir):
    """The tools build commands from their arguments: "key. restart" must meet the same refusal as a plain reply,
    and the walkthrough must still win afterwards (the story was not restarted behind the tracker)."""
    factory = functools.partial(EXAMPLE["TextWorldTools"], games_dir=str(textworld_games_dir))
    env, plain = ToolEnvironment(factory), TextWorldEnv(games_dir=str(textworld_games_dir))
    task = textworld_train_tasks[0]
    env.reset(task)
    for attack in ({"name": "take", "arguments": {"item": "key. restart"}},
                   {"name": "go", "arguments": {"direction": "north, quit"}},
                   {"name": "examine", "arguments": {"target": "me, restore"}}):
        result = env.step(json.dumps([attack]))
        assert result.reward == 0 and not result.won and not result.done
    for command in plain.expert_actions(task):
        result = env.step(json.dumps([EXAMPLE["command_as_tool_call"](command)]))
    assert result.done and result.won
    env.close()
    plain.close()
