"""Multi-turn GRPO on TextWorld played through tool calls: the game's commands are tools (go, take, open, ...).

    # A model whose chat template supports tools (the offline default's does not):
    accelerate launch examples/textworld_tools.py --config recipes/textworld_w2-o3-q4_grpo.yaml \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct

`TextWorldTools` is written as TRL users write environments for `GRPOTrainer(environment_factory=...)`: `reset(**row)`,
one public method per command (their docstrings give the model the tools' schemas), and `reward` / `done` / `won`
attributes. `ToolEnvironment` plays it as a multi-turn environment: each reply's tool calls are read with TRL's
response parsing (`action_parser="tool_calls"`, set here), the tools' results are the next observation, and the
per-turn reward is the score gained in the turn. A reply without a well-formed tool call is a format error. Every
field of `TextWorldScriptArguments`, `MultiTurnGRPOConfig` and `ModelSetup` can be set in the YAML or on the command
line.
"""

import functools
import re
from dataclasses import dataclass

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.commands.parsing import CommandParser
from trl_multiturn.commands.script_args import TextWorldScriptArguments
from trl_multiturn.commands.train import train_on_textworld
from trl_multiturn.envs.textworld.env import TextWorldEnv
from trl_multiturn.envs.tools import tool_chat_template_kwargs, tool_environment
from trl_multiturn.model_setup import ModelSetup


class TextWorldTools:
    """A TextWorld game whose commands are tools (a TRL-style tool environment)."""

    def __init__(self, **textworld_settings):
        self.game = TextWorldEnv(**textworld_settings)
        self.reward, self.done, self.won = 0.0, True, False

    def reset(self, **task) -> str:
        self.reward, self.done, self.won = 0.0, False, False
        return self.game.reset(task)

    def __del__(self):
        self.game.close()

    def _play(self, command: str) -> str:
        if self.done:
            raise ValueError("The game is over.")
        result = self.game.step(command)
        self.reward += result.reward
        self.done, self.won = result.done, result.won
        return result.observation

    def go(self, direction: str) -> str:
        """Walk to the next room.

        Args:
            direction: north, south, east or west
        """
        return self._play(f"go {direction}")

    def take(self, item: str, source: str | None = None) -> str:
        """Pick an item up, from the room or from a container or supporter.

        Args:
            item: the item to take
            source: where the item is (a container or supporter), if not on the floor
        """
        return self._play(f"take {item} from {source}" if source else f"take {item}")

    def drop(self, item: str) -> str:
        """Drop an item you carry on the floor.

        Args:
            item: the item to drop
        """
        return self._play(f"drop {item}")

    def open(self, target: str) -> str:
        """Open a door or a container.

        Args:
            target: what to open
        """
        return self._play(f"open {target}")

    def close(self, target: str) -> str:
        """Close a door or a container.

        Args:
            target: what to close
        """
        return self._play(f"close {target}")

    def unlock(self, target: str, key: str) -> str:
        """Unlock a door or a container with a key you carry.

        Args:
            target: what to unlock
            key: the key
        """
        return self._play(f"unlock {target} with {key}")

    def lock(self, target: str, key: str) -> str:
        """Lock a door or a container with a key you carry.

        Args:
            target: what to lock
            key: the key
        """
        return self._play(f"lock {target} with {key}")

    def put(self, item: str, supporter: str) -> str:
        """Put an item you carry on a supporter (a table, a shelf, ...).

        Args:
            item: the item to put
            supporter: what to put it on
        """
        return self._play(f"put {item} on {supporter}")

    def insert(self, item: str, container: str) -> str:
        """Put an item you carry into a container (a box, a chest, ...).

        Args:
            item: the item to insert
            container: what to put it into
        """
        return self._play(f"insert {item} into {container}")

    def examine(self, target: str) -> str:
        """Look closely at something.

        Args:
            target: what to examine
        """
        return self._play(f"examine {target}")

    def eat(self, item: str) -> str:
        """Eat something you carry.

        Args:
            item: what to eat
        """
        return self._play(f"eat {item}")

    def look(self) -> str:
        """Describe the room you are in."""
        return self._play("look")

    def inventory(self) -> str:
        """List what you carry."""
        return self._play("inventory")


# How each command reads as a tool call (the inverse of the tools above): for expert demonstrations and tests.
_COMMAND_CALLS = [
    (r"take (?P<item>.+) from (?P<source>.+)", "take"), (r"(?P<verb>unlock|lock) (?P<target>.+) with (?P<key>.+)", ""),
    (r"put (?P<item>.+) on (?P<supporter>.+)", "put"), (r"insert (?P<item>.+) into (?P<container>.+)", "insert"),
    (r"go (?P<direction>.+)", "go"), (r"take (?P<item>.+)", "take"), (r"drop (?P<item>.+)", "drop"),
    (r"eat (?P<item>.+)", "eat"), (r"(?P<verb>open|close|examine) (?P<target>.+)", ""),
    (r"(?P<verb>look|inventory)", ""),
]


def command_as_tool_call(command: str) -> dict:
    """A TextWorld command as the tool call that plays it, e.g. "take key from box" -> {"name": "take",
    "arguments": {"item": "key", "source": "box"}}; ValueError for a command no tool plays."""
    for pattern, name in _COMMAND_CALLS:
        match = re.fullmatch(pattern, command.strip())
        if match:
            arguments = match.groupdict()
            return {"name": name or arguments.pop("verb"), "arguments": arguments}
    raise ValueError(f"no tool plays the command {command!r}")


@dataclass
class TextWorldToolsArguments(TextWorldScriptArguments):
    """`TextWorldScriptArguments`, the game played through `TextWorldTools`."""

    def tools_factory(self):
        return functools.partial(TextWorldTools, games_dir=self.games_dir,
                                 admissible_commands_in_observation=self.admissible_commands)

    def environment_factory(self):
        return tool_environment(self.tools_factory())


def main(script_args: TextWorldToolsArguments, training_args: MultiTurnGRPOConfig, model_args: ModelSetup) -> None:
    if training_args.action_parser == "first_line":  # the configs' default: this game is played with tool calls
        training_args.action_parser = "tool_calls"
    training_args.chat_template_kwargs = {**tool_chat_template_kwargs(script_args.tools_factory()),
                                          **(training_args.chat_template_kwargs or {})}
    train_on_textworld(MultiTurnGRPOTrainer, script_args, training_args, model_args)


if __name__ == "__main__":
    parser = CommandParser((TextWorldToolsArguments, MultiTurnGRPOConfig, ModelSetup))
    main(*parser.parse_args_and_config())
