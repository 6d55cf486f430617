"""TextWorld game generation: determinism by seed, the on-disk cache, split seed ranges, task datasets, the CLI."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_multiturn.commands.cli import main, parse_seeds
from trl_multiturn.data import SEED_RANGES, split_seeds
from trl_multiturn.envs.textworld.env import TextWorldEnv
from trl_multiturn.envs.textworld.games import (
    ChallengeGameSpec,
    CustomGameSpec,
    game_fingerprint,
    generate_game,
    make_challenge_games,
    make_games,
    spec_from_task,
    walkthrough,
)
from trl_multiturn.envs.textworld.tasks import textworld_tasks

# TextWorld silences this Jericho warning at import; pytest re-enables warnings per test.
pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

REPO = Path(__file__).resolve().parents[3]
SIMPLE = {"rewards": "dense", "goal": "detailed"}


@pytest.fixture(scope="session")
def games_dir(tmp_path_factory):
    """One game cache for the session, shared with test_textworld_env.py: each game is generated once."""
    return tmp_path_factory.getbasetemp() / "textworld_games"


def _first_observation(game_file):
    env = TextWorldEnv()
    try:
        return env.reset({"game_file": str(game_file)})
    finally:
        env.close()


def _start_cli(*args, hash_seed):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": str(hash_seed)}
    command = [sys.executable, "-m", "trl_multiturn.commands.cli", "make-games", "--env", "textworld", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_makes_the_same_games_in_other_processes(games_dir, tmp_path):
    """Same seed -> same game, across processes with different hash seeds. Two CLI runs race on the same games in
    one folder; the CLI writes the games it lists."""
    out = tmp_path / "cli"
    custom = ["--world-size", "2", "--nb-objects", "3", "--quest-length", "4", "--seeds", "0", "--out", str(out)]
    runs = [_start_cli(*custom, hash_seed=1), _start_cli(*custom, hash_seed=2),
            _start_cli("--challenge", "tw-simple", "--rewards", "dense", "--goal", "detailed", "--seeds", "0",
                       "--out", str(out), hash_seed=3)]
    here = make_games(2, 3, 4, seeds=[0], out_dir=games_dir) + make_challenge_games(
        "tw-simple", seeds=[0], out_dir=games_dir, **SIMPLE)
    outputs = [run.communicate(timeout=180) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [err for _, err in outputs]
    there = sorted(out.glob("*.z8"))
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for g in here for p in (g, g.with_suffix(".json")))
    assert all(str(p) in "".join(stdout for stdout, _ in outputs) for p in there)
    for mine, theirs in zip(sorted(here), there):
        assert game_fingerprint(mine) == game_fingerprint(theirs)
        assert walkthrough(mine) == walkthrough(theirs)
        assert _first_observation(mine) == _first_observation(theirs)


def test_custom_games_are_the_games_tw_make_makes(games_dir, tmp_path):
    """A custom spec reproduces `tw-make custom` (the paper's generator) for the same seed."""
    [ours] = make_games(2, 3, 4, seeds=[1], out_dir=games_dir)
    tw_make = Path(sys.executable).with_name("tw-make")
    theirs = tmp_path / "tw-make.z8"
    result = subprocess.run([str(tw_make), "custom", "--world-size", "2", "--nb-objects", "3", "--quest-length",
                             "4", "--seed", "1", "--output", str(theirs), "--silent"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert game_fingerprint(ours) == game_fingerprint(theirs)


def test_different_seeds_make_different_games(games_dir):
    games = make_games(2, 3, 4, seeds=[0, 1], out_dir=games_dir)
    games += make_challenge_games("tw-simple", seeds=[0, 1], out_dir=games_dir, **SIMPLE)
    fingerprints = [game_fingerprint(game) for game in games]
    assert len(set(fingerprints)) == len(fingerprints)


def test_custom_game_has_the_requested_quest_length(games_dir):
    [game] = make_games(2, 3, 4, seeds=[0], out_dir=games_dir)
    assert len(walkthrough(game)) == 4


def test_generated_games_are_cached_not_regenerated(games_dir):
    spec = CustomGameSpec(2, 3, 4)
    first = generate_game(spec, 0, games_dir)
    stamp = first.stat().st_mtime_ns
    again = generate_game(spec, 0, games_dir)
    assert again == first and again.stat().st_mtime_ns == stamp
    assert first.name == "tw-custom-w2-o3-q4-seed0.z8"
    assert not [p for p in games_dir.iterdir() if p.name.startswith(".tmp")]  # temporary folders cleaned up


def test_seed_ranges_never_overlap():
    for (a, seeds_a), (b, seeds_b) in itertools.combinations(SEED_RANGES.items(), 2):
        assert seeds_a.stop <= seeds_b.start or seeds_b.stop <= seeds_a.start, (a, b)
    assert set(split_seeds("validation", 5)) <= set(SEED_RANGES["validation"])
    assert split_seeds("test", 2, first_game=3) == [SEED_RANGES["test"].start + 3, SEED_RANGES["test"].start + 4]
    with pytest.raises(ValueError, match="num_games"):
        split_seeds("test", len(SEED_RANGES["test"]) + 1)
    with pytest.raises(ValueError, match="split"):
        split_seeds("dev", 1)


def test_textworld_tasks_rows_name_generated_games(games_dir):
    tasks = textworld_tasks(2, 3, 4, split="validation", num_games=2, games_dir=games_dir)
    assert tasks.num_rows == 2
    seeds = list(SEED_RANGES["validation"])[:2]
    for row, seed in zip(tasks, seeds):
        assert row["seed"] == seed
        assert (row["world_size"], row["nb_objects"], row["quest_length"]) == (2, 3, 4)
        assert Path(row["game_file"]).is_file()
        assert Path(row["game_file"]).name == f"tw-custom-w2-o3-q4-seed{seed}.z8"
    lazy = textworld_tasks(challenge="tw-simple", split="test", num_games=3, generate=False, games_dir=games_dir,
                           **SIMPLE)
    assert lazy["game_file"] == [None, None, None]
    assert lazy[0]["challenge"] == "tw-simple" and lazy[0]["rewards"] == "dense"
    assert spec_from_task(lazy[0]) == (ChallengeGameSpec.create("tw-simple", **SIMPLE), SEED_RANGES["test"].start)


def test_cli_takes_seeds_from_a_split(games_dir, capsys):
    assert main(["make-games", "--env", "textworld", "--world-size", "2", "--nb-objects", "3", "--quest-length",
                 "4", "--split", "validation", "--num-games", "1", "--out", str(games_dir)]) == 0
    seed = SEED_RANGES["validation"].start
    assert f"tw-custom-w2-o3-q4-seed{seed}.z8  seed={seed}" in capsys.readouterr().out
    assert (games_dir / f"tw-custom-w2-o3-q4-seed{seed}.json").is_file()


def test_bad_generation_parameters_name_the_field():
    with pytest.raises(ValueError, match="world_size"):
        CustomGameSpec(0, 3, 4)
    with pytest.raises(ValueError, match="rewards"):
        ChallengeGameSpec.create("tw-simple", rewards="lots", goal="brief")
    with pytest.raises(ValueError, match="tw-simple"):
        ChallengeGameSpec.create("tw-unknown")
    with pytest.raises(ValueError, match="challenge"):
        textworld_tasks(2, 3, 4, rewards="dense")


def test_parse_seeds():
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("7") == [7]
    assert parse_seeds("0-1,5,8-9") == [0, 1, 5, 8, 9]


def test_cli_rejects_incomplete_options(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["make-games", "--env", "textworld", "--challenge", "tw-simple", "--rewards", "dense", "--seeds", "0",
              "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--goal" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["make-games", "--env", "textworld", "--world-size", "2", "--seeds", "0", "--out", str(tmp_path)])
    assert "--nb-objects" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["make-games", "--env", "textworld", "--world-size", "2", "--seeds", "3-1", "--out", str(tmp_path)])
    assert "3-1" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
