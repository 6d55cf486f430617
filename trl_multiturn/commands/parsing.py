"""`CommandParser`: TRL's `TrlParser` (dataclass fields, `--config FILE`, the command line over the file) with
errors a command-line user can act on, used by `trl-multiturn train`/`eval`/`play` and by the examples.

- One line per error, with a did-you-mean where a name is misspelt, instead of argparse's usage (hundreds of lines
  for a trainer's config) before the message: `--max_steps two`, `--max_step 2`, `--config quikstart`.
- No prefix matching (`allow_abbrev=False`): `--max_step` is refused, not taken as `--max_steps`.
- A bad YAML value or key names the file and the key, not the command-line flag, and an unknown key gets no advice
  a command-line user cannot follow (TRL's `fail_with_unknown_args=False`).
- `--config` takes a shipped recipe's name as well as a file (`recipes.resolve_config`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from trl import TrlParser

from ..config_checks import did_you_mean
from .recipes import resolve_config_option


def _config_path(args: list[str]) -> str | None:
    for index, arg in enumerate(args):
        if arg == "--config" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--config="):
            return arg.partition("=")[2]
    return None


class CommandParser(TrlParser):
    """A `TrlParser` whose errors are one line naming the field, the value and the fix (see the module docstring).
    `parse_args_and_config` returns what `TrlParser`'s does."""

    def __init__(self, dataclass_types=None, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(dataclass_types, **kwargs)
        self._config = None

    def option_names(self) -> list[str]:
        return [name for action in self._actions for name in action.option_strings]

    def error(self, message: str):
        """argparse's error, without the usage: one line, ending with where the fields are listed."""
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the fields)\n")

    def unknown_options(self, remaining: list[str]) -> str:
        """"unrecognized arguments: ..." with a did-you-mean for the first misspelt option."""
        options = [arg.split("=")[0] for arg in remaining if arg.startswith("--")]
        hint = did_you_mean(options[0], self.option_names()) if options else ""
        return f"unrecognized arguments: {' '.join(remaining)}{hint}"

    def parse_args_and_config(self, args: Iterable[str] | None = None, return_remaining_strings: bool = False,
                              fail_with_unknown_args: bool = True, separate_remaining_strings: bool = False):
        try:
            args = resolve_config_option(list(args) if args is not None else sys.argv[1:])
        except FileNotFoundError as error:
            self.error(str(error))
        self._config = _config_path(args)
        if return_remaining_strings:
            return super().parse_args_and_config(args, True, fail_with_unknown_args, separate_remaining_strings)
        *parsed, config_remaining, cli_remaining = super().parse_args_and_config(
            args, return_remaining_strings=True, separate_remaining_strings=True)
        unknown_keys = [key[2:] for key in config_remaining[::2]]
        if unknown_keys and fail_with_unknown_args:
            names = [name[2:] for name in self.option_names()]
            others = f" (nor {', '.join(map(repr, unknown_keys[1:]))})" if unknown_keys[1:] else ""
            self.error(f"{self._config}: {unknown_keys[0]!r} is not a field of this command{others}"
                       f"{did_you_mean(unknown_keys[0], names)}")
        if cli_remaining:
            self.error(self.unknown_options(cli_remaining))
        return tuple(parsed)

    def set_defaults_with_config(self, **kwargs) -> list[str]:
        """TRL's, after checking each value the YAML gives as text as the command line would check it: a bad one
        is refused naming the file and the key."""
        for action in self._actions:
            value = kwargs.get(action.dest)
            if action.option_strings and isinstance(value, str):
                try:
                    self._check_value(action, self._get_value(action, value))
                except argparse.ArgumentError as error:
                    self.error(f"{self._config}: {action.dest}: {error.message}")
        return super().set_defaults_with_config(**kwargs)
