"""The recipes shipped inside the package (trl_multiturn/recipes/; a checkout's top-level `recipes/` links to it), by
name: `quickstart` is recipes/quickstart.yaml, `paper/algorithms` is recipes/paper/algorithms.yaml.

    trl-multiturn recipes list
    trl-multiturn recipes show quickstart
    trl-multiturn recipes copy quickstart my_run.yaml
    trl-multiturn train grpo --config quickstart        # a shipped name wherever a recipe file is read
"""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

from ..config_checks import did_you_mean

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"


def recipe_names() -> list[str]:
    """Every shipped recipe's name: its path under the recipes folder, without `.yaml`."""
    return sorted(path.relative_to(RECIPES_DIR).with_suffix("").as_posix() for path in RECIPES_DIR.rglob("*.yaml"))


def recipe_path(name: str) -> Path:
    """The file of the shipped recipe `name` (`.yaml` optional); a FileNotFoundError listing the names otherwise."""
    path = RECIPES_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.is_file():
        names = recipe_names()
        raise FileNotFoundError(f"recipe {name!r}: not a shipped recipe{did_you_mean(name, names)}; "
                                "`trl-multiturn recipes list` names them all")
    return path


def resolve_config(value: str) -> str:
    """A `--config` value: an existing file as given, else the shipped recipe of that name (a name that is neither
    is left as given, for the reader to report)."""
    if Path(value).is_file():
        return value
    try:
        return str(recipe_path(value))
    except FileNotFoundError:
        return value


def config_file(value: str) -> str:
    """A `--config` value that must exist: the file as given, else the shipped recipe of that name; a
    FileNotFoundError with a did-you-mean otherwise."""
    if Path(value).is_file():
        return value
    if (RECIPES_DIR / (value if value.endswith(".yaml") else f"{value}.yaml")).is_file():
        return str(recipe_path(value))
    hint = did_you_mean(value, recipe_names())
    raise FileNotFoundError(f"--config {value!r}: neither a file nor a shipped recipe{hint}; `trl-multiturn recipes "
                            "list` names the recipes")


def resolve_config_option(options: list[str]) -> list[str]:
    """`options` with the value of `--config NAME` (or `--config=NAME`) resolved by `config_file`."""
    resolved = list(options)
    for index, option in enumerate(resolved):
        if option == "--config" and index + 1 < len(resolved):
            resolved[index + 1] = config_file(resolved[index + 1])
        elif option.startswith("--config="):
            resolved[index] = f"--config={config_file(option.partition('=')[2])}"
    return resolved


def description(name: str) -> str:
    """What `recipes list` says of a recipe: the first sentence of its header comment, whole, and for a paper study
    its scale (a `_cpu` study shares its first sentence with its paper-scale twin)."""
    lines = []
    for line in (RECIPES_DIR / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#") or line.startswith("#  ") or (lines and not line.strip("# ")):
            break  # the header ends at a non-comment line, an indented command or an empty comment line
        lines.append(line.strip("# "))
    sentence = re.split(r"(?<=\.)\s+(?=[A-Z`])", " ".join(lines), maxsplit=1)[0]
    if name.startswith("paper/"):
        sentence += " CPU scale: 2 cores, offline." if name.endswith("_cpu") else " Paper scale: GPUs."
    return sentence


def _recipes_command(args) -> int:
    if args.action == "list":
        names = recipe_names()
        width = max(map(len, names))
        for name in names:
            print(textwrap.fill(description(name), width=max(60, shutil.get_terminal_size().columns - 1),
                                initial_indent=f"{name:<{width}}  ", subsequent_indent=" " * (width + 2)))
        return 0
    source = recipe_path(args.name)
    if args.action == "show":
        print(source.read_text(), end="")
        return 0
    dest = Path(args.dest) if args.dest else Path(source.name)
    if dest.is_dir():
        dest = dest / source.name
    if dest.exists() and not args.overwrite:
        raise FileExistsError(f"{dest} exists; give another DEST or --overwrite")
    shutil.copyfile(source, dest)
    print(f"wrote {dest} (train with --config {dest})")
    return 0


def add_recipes_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "recipes", help="List, show or copy the recipes shipped with the package (each is also a --config NAME).",
        description="The YAML recipes inside the package: `list` names them, `show NAME` prints one, `copy NAME "
                    "[DEST]` writes it to edit. Any --config (and `study`) also takes a NAME.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="Every shipped recipe with the first sentence of its description.")
    show = actions.add_parser("show", help="Print a recipe.")
    show.add_argument("name", metavar="NAME", help="e.g. quickstart or paper/algorithms_cpu")
    copy = actions.add_parser("copy", help="Copy a recipe to edit it.")
    copy.add_argument("name", metavar="NAME", help="e.g. quickstart")
    copy.add_argument("dest", metavar="DEST", nargs="?", help="File or folder (default: NAME's file name, here).")
    copy.add_argument("--overwrite", action="store_true", help="Replace DEST if it exists.")
    parser.set_defaults(func=_recipes_command)
