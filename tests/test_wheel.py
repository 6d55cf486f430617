"""The wheel is the tool: built from this repository and installed into a new virtual environment, its
`trl-multiturn` command runs the README's main job (SFT warm start, then DAgger, then `eval`) from a folder with no
checkout in reach.

Offline by construction: the wheel is built without build isolation when the running interpreter already has the
build backend pyproject.toml declares, and installed with `--no-deps`. The dependencies (torch, TRL, TextWorld, ...)
are the test venv's, made visible to the new venv by a `.pth` file listing the test venv's site-packages; the
package, its data files and its entry point are only the wheel's (`trl_multiturn.__file__` is checked to lie in the
new venv, PYTHONPATH is unset, and the editable install's finder in the test venv is never run, as a path listed in
a `.pth` file has its own `.pth` files ignored). scripts/wheel_check.sh is the fresh-machine version: dependencies
from the registry.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import trl_multiturn
from trl_multiturn.commands.recipes import RECIPES_DIR, recipe_names

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "trl_multiturn")
"""What the build reads: the project table's readme and license files, and the package."""


def _backend_installed() -> bool:
    """Whether every `build-system.requires` entry is satisfied by the running interpreter."""
    for text in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(text)
        try:
            if not requirement.specifier.contains(version(requirement.name), prereleases=True):
                return False
        except PackageNotFoundError:
            return False
    return True


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (setuptools writes build/ and *.egg-info beside them)."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    offline = ["--no-build-isolation", "--no-index"] if _backend_installed() else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *offline, "-w", str(dist), str(src)],
                   check=True)
    (built,) = dist.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A new venv holding only the wheel, with the test venv's site-packages appended to its path."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "test_venv_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return root


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """An empty folder to run from: no checkout, no recipes/ folder."""
    return tmp_path_factory.mktemp("no-checkout")


def _run(venv: Path, workdir: Path, *args: str) -> str:
    """`args` run with the venv's programs from `workdir`, offline and without PYTHONPATH; their stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=workdir, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def test_the_wheel_holds_the_package_its_recipes_the_license_and_the_command(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (dist_info,) = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
        license_text = archive.read(f"{dist_info}/licenses/LICENSE").decode()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        metadata = email.message_from_bytes(archive.read(f"{dist_info}/METADATA"))
    package = ROOT / "trl_multiturn"
    for pattern in ("*.py", "*.yaml", "*.md"):  # *.md: the SWE-Gym reward's threat model (envs/swegym/README.md)
        expected = {p.relative_to(ROOT).as_posix() for p in package.rglob(pattern) if "__pycache__" not in p.parts}
        assert expected and expected <= names, sorted(expected - names)
    tasks = [p for p in (package / "envs/swegym/tasks").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    shipped = {p.relative_to(ROOT).as_posix() for p in tasks}  # the SWE-Gym tasks' data: repositories, patches
    assert any(p.suffix == ".patch" for p in tasks) and shipped <= names, sorted(shipped - names)
    assert "trl_multiturn/envs/swegym/README.md" in names
    assert len({n for n in names if n.startswith("trl_multiturn/recipes/")}) == len(list(RECIPES_DIR.rglob("*.yaml")))
    assert license_text == (ROOT / "LICENSE").read_text()
    assert metadata["License-Expression"] == PYPROJECT["project"]["license"]
    assert metadata["Version"] == trl_multiturn.__version__  # pyproject's version is the package's __version__
    for name, target in PYPROJECT["project"]["scripts"].items():
        assert f"{name} = {target}" in entry_points


def test_the_command_runs_the_wheels_package_and_its_shipped_recipes(venv, workdir):
    imported = _run(venv, workdir, "python", "-c", "import trl_multiturn; print(trl_multiturn.__file__)").strip()
    assert Path(imported).is_relative_to(venv) and not Path(imported).is_relative_to(ROOT)
    assert _run(venv, workdir, "trl-multiturn", "--version").startswith(f"trl-multiturn {trl_multiturn.__version__} (")
    listed = [line.split()[0] for line in _run(venv, workdir, "trl-multiturn", "recipes", "list").splitlines()
              if not line.startswith(" ")]  # a description's continuation lines are indented
    assert listed == recipe_names() and "quickstart" in listed
    _run(venv, workdir, "trl-multiturn", "recipes", "copy", "quickstart")
    assert (workdir / "quickstart.yaml").read_text() == (RECIPES_DIR / "quickstart.yaml").read_text()


def test_the_installed_package_loads_the_shipped_swegym_tasks_as_the_checkout_does(venv, workdir):
    from trl_multiturn.envs.swegym.tasks import task_rows

    code = "import json; from trl_multiturn.envs.swegym.tasks import task_rows; print(json.dumps(task_rows()))"
    installed = json.loads(_run(venv, workdir, "python", "-c", code))
    assert len(installed) == 12 and installed == task_rows()


def test_the_readme_main_job_runs_from_the_installed_command(venv, workdir, tiny_chatml_model, textworld_games_dir):
    """scripts/quickstart.sh's two steps by shipped recipe name, at the smallest size: one step each on a tiny
    model, two training games; DAgger starts from the SFT step's output, as the recipe says."""
    games = ["--games_dir", str(textworld_games_dir), "--disable_tqdm", "true"]
    sft = _run(venv, workdir, "trl-multiturn", "train", "sft", "--config", "quickstart_sft", "--model_name_or_path",
               str(tiny_chatml_model), "--max_steps", "1", "--num_train_games", "2", *games)
    assert "MultiTurnSFTTrainer: saved the model" in sft
    dagger = _run(venv, workdir, "trl-multiturn", "train", "dagger", "--config", "quickstart_dagger", "--max_steps",
                  "1", "--num_train_games", "2", "--num_eval_games", "1", *games)
    assert "MultiTurnDAggerTrainer: saved the model" in dagger and "held-out success, the same games:" in dagger
    for run in ("quickstart_sft", "quickstart_dagger"):
        out = workdir / "outputs" / run
        assert (out / "model.safetensors").is_file() and (out / "episode_settings.json").is_file()
    trained = workdir / "outputs" / "quickstart_dagger"
    before = set(trained.glob("eval_results*.json"))
    evaluated = _run(venv, workdir, "trl-multiturn", "eval", "--config", "quickstart_dagger", "--num_eval_games", "1",
                     "--no_progress")
    (written,) = set(trained.glob("eval_results*.json")) - before
    assert f"results: {written.relative_to(workdir)}" in evaluated
    assert "held-out greedy evaluation on 1 test games" in evaluated
