"""The `trl-multiturn` command.

    trl-multiturn make-games --env textworld --world-size 2 --nb-objects 3 --quest-length 4 --seeds 0-9 --out games
    trl-multiturn make-games --env textworld --challenge tw-simple --rewards dense --goal detailed --split test \
        --num-games 20 --out games

Adding a subcommand: write `_add_<name>(subparsers)` that builds its parser and sets `func` (called with the parsed
arguments, returns an exit code), and list it in `SUBCOMMANDS`. Adding an environment to `make-games`: an argument
group for its options in `_add_make_games` and a handler in `MAKE_GAMES`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable


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
    from .data import split_seeds  # imports `datasets`: only when needed

    return split_seeds(args.split, args.num_games, args.first_game)


def _make_textworld_games(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .envs.textworld_games import ChallengeGameSpec, CustomGameSpec, GameGenerationError, generate_game

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
    from .envs.alfworld.tasks import TASK_TYPES
    from .envs.alfworld_gen import ALFWorldGenConfig, GenerationError, generate_games

    knobs = {"num_receptacles": args.num_receptacles, "num_distractors": args.num_distractors,
             "num_closed": args.num_closed}
    try:
        config = ALFWorldGenConfig(**{key: value for key, value in knobs.items() if value is not None})
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
                [game_file] = generate_games(args.out, [seed], [task_type], folder, config, args.overwrite)
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
    alfworld.add_argument("--num-receptacles", type=int, help="Receptacles per room. Default: 8.")
    alfworld.add_argument("--num-distractors", type=int, help="Objects besides the task's own. Default: 6.")
    alfworld.add_argument("--num-closed", type=int, help="Openable receptacles, closed at start. Default: 2.")
    alfworld.add_argument("--alfworld-split", choices=["train", "valid_seen", "valid_unseen"],
                          help="json_2.1.1 folder to write to. Default: from --split (validation: valid_seen, "
                               "test: valid_unseen, held-out rooms), else train.")
    parser.set_defaults(func=lambda args: MAKE_GAMES[args.env](args, parser))


SUBCOMMANDS: list[Callable] = [_add_make_games]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl-multiturn", description="Multi-turn agent training on top of TRL.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
