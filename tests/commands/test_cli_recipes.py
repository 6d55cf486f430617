"""`trl-multiturn recipes`: the recipes ship inside the package, and a shipped name works wherever a recipe file
is read (`--config NAME`, `study NAME`)."""

from pathlib import Path

from trl_multiturn.commands.cli import main, trainer_parser
from trl_multiturn.commands.recipes import RECIPES_DIR, recipe_names, resolve_config_option

ROOT = Path(__file__).resolve().parents[2]


def test_the_checkouts_recipes_folder_is_the_packages():
    assert RECIPES_DIR.parent.name == "trl_multiturn"
    assert (ROOT / "recipes").resolve() == RECIPES_DIR


def _listed(capsys) -> dict[str, str]:
    """`recipes list` as {name: description}, continuation lines joined."""
    assert main(["recipes", "list"]) == 0
    entries: dict[str, str] = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith(" "):
            entries[next(reversed(entries))] += " " + line.strip()  # a continuation of the last recipe's text
        else:
            name, _, text = line.partition(" ")
            entries[name] = text.strip()
    return entries


def test_list_names_every_recipe_with_its_first_sentence_whole(capsys):
    entries = _listed(capsys)
    assert list(entries) == recipe_names() and len(entries) == len(list(RECIPES_DIR.rglob("*.yaml")))
    assert entries["quickstart"] == (
        "A short multi-turn GRPO run on generated w1-o2-q2 TextWorld games, from the SFT warm start of the README's "
        "main job (scripts/quickstart.sh's step 1), ending with greedy success on held-out (test-split) games.")
    assert all(text.endswith(".") for text in entries.values()), entries  # no description cut mid-sentence


def test_list_tells_a_cpu_study_from_its_paper_scale_twin(capsys):
    entries = _listed(capsys)
    assert entries["paper/algorithms_cpu"] != entries["paper/algorithms"]
    assert entries["paper/algorithms_cpu"].endswith("CPU scale: 2 cores, offline.")
    assert entries["paper/algorithms"].endswith("Paper scale: GPUs.")
    assert "at CPU scale" in entries["alfworld_gigpo_stepwise_cpu"]
    assert "at paper scale" in entries["alfworld_gigpo_stepwise"]


def test_show_prints_the_recipe(capsys):
    assert main(["recipes", "show", "quickstart"]) == 0
    assert capsys.readouterr().out == (RECIPES_DIR / "quickstart.yaml").read_text()


def test_copy_writes_the_recipe_and_never_overwrites_unasked(tmp_path, capsys):
    dest = tmp_path / "mine.yaml"
    assert main(["recipes", "copy", "paper/algorithms_cpu", str(dest)]) == 0
    assert dest.read_text() == (RECIPES_DIR / "paper" / "algorithms_cpu.yaml").read_text()
    dest.write_text("edited")
    assert main(["recipes", "copy", "paper/algorithms_cpu", str(dest)]) == 2
    assert "exists" in capsys.readouterr().err and dest.read_text() == "edited"
    assert main(["recipes", "copy", "quickstart", str(tmp_path)]) == 0
    assert (tmp_path / "quickstart.yaml").read_text() == (RECIPES_DIR / "quickstart.yaml").read_text()


def test_a_misspelt_name_is_one_error_line_with_a_suggestion(capsys):
    assert main(["recipes", "show", "quickstrat"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'quickstart'?" in err and "recipes list" in err


def test_config_takes_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ folder here: the name alone must find the file
    assert resolve_config_option(["--config", "quickstart", "--max_steps", "1"]) == [
        "--config", str(RECIPES_DIR / "quickstart.yaml"), "--max_steps", "1"]
    assert resolve_config_option(["--config=paper/rewards"]) == [f"--config={RECIPES_DIR / 'paper' / 'rewards.yaml'}"]
    local = tmp_path / "quickstart"
    local.write_text("max_steps: 3\n")
    assert resolve_config_option(["--config", "quickstart"]) == ["--config", "quickstart"]  # a file wins
    _, _, by_name, _ = trainer_parser("grpo").parse_args_and_config(
        args=resolve_config_option(["--config", "quickstart.yaml", "--use_cpu", "true"]))
    _, _, by_file, _ = trainer_parser("grpo").parse_args_and_config(
        args=["--config", str(RECIPES_DIR / "quickstart.yaml"), "--use_cpu", "true"])
    assert by_name.max_steps == by_file.max_steps and by_name.output_dir == by_file.output_dir


def test_study_takes_a_shipped_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["study", "paper/algorithms_cpu", "--check"]) == 0
    capsys.readouterr()
    assert main(["study", "paper/no_such_study", "--check"]) == 2
    assert "paper/no_such_study" in capsys.readouterr().err
