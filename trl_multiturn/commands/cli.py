"""The `trl-multiturn` command.

    trl-multiturn make-games --env textworld --world-size 2 --nb-objects 3 --quest-length 4 --seeds 0-9 --out games
    trl-multiturn make-games --env textworld --challenge tw-simple --rewards dense --goal detailed --split test \
        --num-games 20 --out games
    trl-multiturn train grpo --config recipes/textworld_w2-o3-q4_grpo.yaml --max_steps 50
    trl-multiturn train sft --config recipes/textworld_sft.yaml
    trl-multiturn train grpo --env alfworld --task_types pick_and_place_simple --num_train_games 12 --max_steps 10
    trl-multiturn eval --model_name_or_path outputs/textworld_sft --num_eval_games 50 --max_turns 8
    trl-multiturn eval --config recipes/quickstart.yaml
    trl-multiturn plot outputs/quickstart_grpo outputs/other_run -o curves.png
    trl-multiturn recipes list

Adding a subcommand: write `_add_<name>(subparsers)` that builds its parser and sets `func` (called with the parsed
arguments, returns an exit code), and list it in `SUBCOMMANDS`. A command whose options are dataclass fields
registers with `add_help=False` and `takes_options=True`, and parses `args.options` with its own `CommandParser` (TRL's
`TrlParser` with one-line errors). No parser matches a prefix of an option (`allow_abbrev` is off everywhere).
Help strings are %-formatted by argparse: write a literal percent sign as %%. Adding an environment to
`make-games`: an argument group for its options in `_add_make_games` and a handler in `MAKE_GAMES`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .. import __version__
from ..data import split_seeds
from ..envs.alfworld.generator import ALFWorldGenConfig
from ..envs.suites import load_installed_suites
from ..model_setup import ModelSetup
from .episodes import add_episodes_parser
from .parsing import CommandParser
from .recipes import add_recipes_parser, resolve_config_option
from .script_args import EnvArguments, TextWorldScriptArguments
from .serve import add_serve_parser
from .study import add_study_parser
from .train import TRAINERS, config_class, trainer_class


def parse_seeds(text: str) -> list[int]:
    """`"0-9"`, `"7"` or `"0-4,10,20-21"` -> the listed seeds, ranges inclusive."""
    seeds = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if sep else low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad seeds {text!r}: write e.g. 0-9, 7 or 0-4,10") from None
        if first < 0 or last < first:
            raise argparse.ArgumentTypeError(f"bad seed range {part!r}: write LOW-HIGH with 0 <= LOW <= HIGH")
        seeds.extend(range(first, last + 1))
    return seeds


def _parse_setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"bad setting {text!r}: write KEY=VALUE, e.g. recipe=2")
    flags = {"true": True, "false": False}
    return key.strip().replace("-", "_"), flags.get(value.strip().lower(), value.strip())


def _seeds(args: argparse.Namespace) -> list[int]:
    """`--seeds`, else `--num-games` seeds of `--split`'s range."""
    if args.seeds is not None:
        return args.seeds
    return split_seeds(args.split, args.num_games, args.first_game)


def _make_textworld_games(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # The engines are optional extras: imported only for the environment asked for.
    from ..envs.textworld.games import ChallengeGameSpec, CustomGameSpec, GameGenerationError, generate_game

    custom = (args.world_size, args.nb_objects, args.quest_length)
    try:
        if args.challenge is not None:
            if any(value is not None for value in custom):
                parser.error("--challenge makes challenge games: drop --world-size/--nb-objects/--quest-length")
            settings = dict(args.challenge_setting)
            settings.update({k: v for k, v in (("rewards", args.rewards), ("goal", args.goal)) if v is not None})
            spec = ChallengeGameSpec.create(args.challenge, **settings)
        else:
            if None in custom:
                parser.error("custom TextWorld games need --world-size, --nb-objects and --quest-length "
                             "(or pass --challenge tw-simple)")
            spec = CustomGameSpec(*custom)
        seeds = _seeds(args)
    except ValueError as exc:
        parser.error(str(exc))

    start = time.perf_counter()
    for seed in seeds:
        game_start = time.perf_counter()
        try:
            game_file = generate_game(spec, seed, args.out, overwrite=args.overwrite)
        except (ValueError, GameGenerationError) as exc:
            print(f"error: seed {seed}: {exc}", file=sys.stderr)
            return 1
        print(f"{game_file}  seed={seed}  {time.perf_counter() - game_start:.2f} s", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{len(seeds)} games in {args.out} ({elapsed:.1f} s, {elapsed / len(seeds):.2f} s per game)")
    return 0


def _make_alfworld_games(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..envs.alfworld.generator import GenerationError, generate_games
    from ..envs.alfworld.tasks import TASK_TYPES

    try:
        config = ALFWorldGenConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ALFWorldGenConfig)})
        seeds = _seeds(args)
    except ValueError as exc:
        parser.error(str(exc))
    # Seed-range splits map onto ALFWorld's folders; `test` games are played in ALFRED's held-out rooms.
    folder = args.alfworld_split or {"validation": "valid_seen", "test": "valid_unseen"}.get(args.split, "train")
    start, count = time.perf_counter(), 0
    for task_type in args.task_types or TASK_TYPES:
        for seed in seeds:
            game_start = time.perf_counter()
            try:
                [game_file] = generate_games(args.out, [seed], [task_type], folder, config, args.overwrite,
                                             progress=False)
            except (ValueError, GenerationError) as exc:
                print(f"error: {task_type} seed {seed}: {exc}", file=sys.stderr)
                return 1
            count += 1
            print(f"{game_file}  seed={seed}  {time.perf_counter() - game_start:.2f} s", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{count} games in {args.out} ({elapsed:.1f} s, {elapsed / count:.2f} s per game)")
    return 0


MAKE_GAMES: dict[str, Callable[[argparse.Namespace, argparse.ArgumentParser], int]] = {
    "textworld": _make_textworld_games,
    "alfworld": _make_alfworld_games,
}


def _add_make_games(subparsers) -> None:
    parser = subparsers.add_parser("make-games", help="Generate a set of games (tasks) for an environment.",
                                   description="Generate games, deterministic by seed; existing games are reused.")
    parser.add_argument("--env", required=True, choices=sorted(MAKE_GAMES), help="The environment.")
    parser.add_argument("--out", required=True, type=Path, help="Folder to write the games to.")
    parser.add_argument("--overwrite", action="store_true", help="Regenerate games that already exist.")
    seeds = parser.add_mutually_exclusive_group(required=True)
    seeds.add_argument("--seeds", type=parse_seeds, help="Seeds to generate, e.g. 0-9 or 0-4,10.")
    seeds.add_argument("--split", choices=["train", "validation", "test"],
                       help="Take seeds from this split's range (trl_multiturn.data.SEED_RANGES).")
    parser.add_argument("--num-games", type=int, default=10, help="With --split: how many games. Default: 10.")
    parser.add_argument("--first-game", type=int, default=0,
                        help="With --split: index of the first game in the split's range. Default: 0.")

    textworld = parser.add_argument_group("TextWorld (--env textworld)")
    textworld.add_argument("--world-size", type=int, help="Custom games: number of rooms.")
    textworld.add_argument("--nb-objects", type=int, help="Custom games: number of objects.")
    textworld.add_argument("--quest-length", type=int, help="Custom games: number of actions the quest needs.")
    textworld.add_argument("--challenge", help="A TextWorld challenge instead of custom games, e.g. tw-simple.")
    textworld.add_argument("--rewards", choices=["dense", "balanced", "sparse"], help="tw-simple: reward frequency.")
    textworld.add_argument("--goal", choices=["detailed", "brief", "none"], help="tw-simple: objective shown.")
    textworld.add_argument("--challenge-setting", type=_parse_setting, action="append", default=[],
                           metavar="KEY=VALUE", help="Another challenge setting, e.g. test=true; repeatable.")

    alfworld = parser.add_argument_group("ALFWorld (--env alfworld)")
    alfworld.add_argument("--task-types", type=lambda text: [t.strip() for t in text.split(",") if t.strip()],
                          help="Comma-separated ALFRED task types. Default: all six.")
    for f in dataclasses.fields(ALFWorldGenConfig):  # the generator's fields, with its defaults and help
        alfworld.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                              help=f"{f.metadata['help']} Default: {f.default}.")
    alfworld.add_argument("--alfworld-split", choices=["train", "valid_seen", "valid_unseen"],
                          help="json_2.1.1 folder to write to. Default: from --split (validation: valid_seen, "
                               "test: valid_unseen, held-out rooms), else train.")
    parser.set_defaults(func=lambda args: MAKE_GAMES[args.env](args, parser))


# Commands whose options are dataclass fields are parsed as TRL's own CLI does: the subcommand is registered with
# `add_help=False`, and its `TrlParser` (built when the command runs) reads `--config FILE`, the fields, and
# `--help`, which lists every field with its help.


def trainer_parser(algo: str):
    """The `TrlParser` of `trl-multiturn train <algo>`: `TextWorldScriptArguments`, `EnvArguments`, the trainer's
    config and `ModelSetup` (TRL's `ModelConfig`: dtype, LoRA, 4/8-bit)."""
    return CommandParser(
        (TextWorldScriptArguments, EnvArguments, config_class(algo), ModelSetup),
        prog=f"trl-multiturn train {algo}",
        description=f"Train {TRAINERS[algo][0]} on a registered environment (--env: textworld, alfworld, swegym or "
                    f"your own; TextWorld is what examples/textworld_{algo}.py does): --config recipe.yaml sets any "
                    "field below, and the command line overrides it.")


# `train`, `eval` and `play` import their modules when they run: those load torch, which `serve`, `make-games`,
# `recipes` and `--help` start without (a served environment's workers are forked from a process without it).


def _train(args: argparse.Namespace) -> int:
    from .env_tasks import train_on_env

    script_args, env_args, training_args, model_args = trainer_parser(args.algo).parse_args_and_config(
        args=args.options)
    train_on_env(trainer_class(args.algo), script_args, env_args, training_args, model_args)
    return 0


def _add_train(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="Train with one of the trainers on TextWorld games or another environment (--env).",
        description="trl-multiturn train grpo --config recipes/textworld_w2-o3-q4_grpo.yaml [--field value ...]; "
                    "trl-multiturn train grpo --env alfworld ...; `trl-multiturn train ALGO --help` lists the "
                    "fields.",
    )
    algos = parser.add_subparsers(dest="algo", required=True, metavar="ALGO")
    for algo, (trainer, _) in sorted(TRAINERS.items()):
        sub = algos.add_parser(algo, help=f"{trainer} (--help lists its fields)", add_help=False)
        sub.set_defaults(func=_train, takes_options=True)


def eval_parser(command: str = "eval"):
    """The `TrlParser` of `trl-multiturn eval` (and of `play`, which takes the same fields)."""
    from .eval import EvalArguments

    return CommandParser(
        (TextWorldScriptArguments, EvalArguments), prog=f"trl-multiturn {command}",
        description="Greedy success of a model on held-out tasks (of a registered suite: TextWorld, ALFWorld, SWE-Gym "
                    "or your own) with a 95% "
                    "Wilson interval, played with the episode settings saved with the model (episode_settings.json; "
                    "arguments given here win). --config accepts a training recipe. Writes eval_results_*.json to the "
                    "folder of a model given by its folder, else to outputs/eval/<model> (--results_dir: elsewhere).")


def _eval(args: argparse.Namespace) -> int:
    from .eval import run_eval

    return run_eval(eval_parser(), args.options)


def _add_eval(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="Greedy success of a saved model on held-out tasks, with a 95%% confidence interval "
                     "(--help lists the fields).", add_help=False,
    )
    parser.set_defaults(func=_eval, takes_options=True)


def _play(args: argparse.Namespace) -> int:
    from .eval import run_eval

    return run_eval(eval_parser("play"), ["--num_eval_games", "1", "--show_episodes", str(2**31 - 1),
                                          "--no_save_results", "--no_progress", *args.options])


def _add_play(subparsers) -> None:
    parser = subparsers.add_parser(
        "play", help="Play held-out episodes with a saved model and print each turn by turn (observation, reply, "
                     "action, reward); eval's fields, one game by default, nothing written (--help: the fields).",
        add_help=False,
    )
    parser.set_defaults(func=_play, takes_options=True)


def _plot(args: argparse.Namespace) -> int:
    from ..plotting import plot_runs  # the `plot` extra (matplotlib)

    plot_runs(args.run_dirs, args.output, args.labels)
    print(f"wrote {args.output}")
    return 0


def _add_plot(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot", help="Learning curves (loss, success with held-out points, return, turns, KL, entropy) of one or more "
                     "runs in one figure; panels nothing was logged for are left out.",
        description="Reads trainer_state.json of each run folder (or of its latest checkpoint-N) and draws its "
                    "logged history against the step. Needs matplotlib (the `plot` extra).")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="Trainer output folders.")
    parser.add_argument("-o", "--output", default="curves.png", help="Image to write (.png, .pdf, .svg).")
    parser.add_argument("--labels", nargs="+", help="One legend label per run (default: folder names).")
    parser.set_defaults(func=_plot)


SUBCOMMANDS: list[Callable] = [_add_make_games, _add_train, _add_eval, _add_play, add_study_parser, _add_plot,
                               add_episodes_parser, add_serve_parser, add_recipes_parser]


USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError, ModuleNotFoundError)
"""What the package raises for bad input (a config field, a path, a study file) or a missing optional package:
printed as one `error:` line."""


def _version() -> str:
    def installed(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"trl-multiturn {__version__} (trl {installed('trl')}, transformers {installed('transformers')}, " \
           f"torch {installed('torch')})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl-multiturn", description="Multi-turn agent training on top of TRL.")
    parser.add_argument("--version", action="version", version=_version())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    for command in subparsers.choices.values():
        command.add_argument("--debug", action="store_true",
                             help="Show the full traceback of an input error instead of one `error:` line.")
    _no_abbreviations(parser)
    return parser


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Turn off argparse's prefix matching in `parser` and every parser under it: `--max_step` must not be taken as
    `--max_steps`, nor `--d` as `--debug`."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "takes_options", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if getattr(args, "takes_options", False):
            # `--config FILE|NAME` and field overrides, parsed by the command's CommandParser
            args.options = resolve_config_option(rest)
        load_installed_suites()
        return args.func(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        print(f"trl-multiturn {args.command}: error: {error} (--debug shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
