"""The package layout: one package per environment, the public names the README documents resolve to their
objects, and the names of earlier layouts are gone (version 0.1.0 keeps no deprecation shims)."""

import importlib
import importlib.util
import subprocess
import sys


def test_readme_import_paths_resolve_to_the_moved_objects():
    from trl_multiturn.data import textworld_tasks
    from trl_multiturn.envs import TextWorldEnv
    from trl_multiturn.envs.textworld.env import TextWorldEnv as moved_env
    from trl_multiturn.envs.textworld.tasks import textworld_tasks as moved_tasks

    assert textworld_tasks is moved_tasks and TextWorldEnv is moved_env


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


def test_an_environment_worker_does_not_import_torch():
    # Worker processes and Ray actors import the pool's environment side and the environments; torch there would cost
    # ~250 MiB per actor for names it never uses (`trl_multiturn.rollout` resolves its public names lazily).
    modules = ("trl_multiturn.rollout.ray_pool", "trl_multiturn.rollout.env_pool", "trl_multiturn.testing",
               "trl_multiturn.envs.textworld", "trl_multiturn.envs.alfworld", "trl_multiturn.envs.swegym")
    code = (f"import sys; [__import__(m) for m in {modules!r}]; "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_names_of_earlier_layouts_are_gone():
    import trl_multiturn
    import trl_multiturn.rollout

    assert importlib.util.find_spec("trl_multiturn.envs.alfworld_gen") is None
    assert importlib.util.find_spec("trl_multiturn.envs.alfworld.generator") is not None
    assert importlib.util.find_spec("trl_multiturn.envs.openenv_server") is None
    assert importlib.util.find_spec("trl_multiturn.commands.openenv_server") is not None
    for package in (trl_multiturn, trl_multiturn.rollout):
        assert not hasattr(package, "MultiTurnRolloutCollator") and package.EpisodeRunner


def test_the_house_has_no_circle_and_no_arrow_running_back_up():
    """scripts/import_graph.py's layers (base < contract < envs < rollout < credit < evaluation < trainers <
    commands, CONTRIBUTING.md): no module imports one of a higher layer (an engine knows nothing of the rollout
    that plays it: the OpenEnv server, which runs one in an `EnvPool`, is a driver in `commands/`; the rollout knows
    nothing of the credit), no two modules import each other, and the rollout imports none of TRL's training
    utilities (`trl.trainer`)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "import_graph.py"
    report = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    assert "package-internal import arrows" in report and "commands.cli" in report  # it read the package
    assert "circles (0):" in report, report[report.index("circles"):]
    assert "arrows back up (0):" in report, report[report.index("arrows back up"):]
    assert "forbidden imports (0):" in report, report[report.index("forbidden imports"):]


def test_the_shipped_swegym_repositories_are_data_pytest_does_not_collect():
    """The SWE-Gym tasks ship their projects' own test files (run in the sandbox when an episode is graded); pointed
    at them, our pytest collects nothing (pyproject.toml's norecursedirs)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    tasks = root / "trl_multiturn" / "envs" / "swegym" / "tasks"
    assert len(list(tasks.glob("*/commits/*/tests/test_*.py"))) == 12  # one test file per shipped project
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(tasks)], cwd=root, capture_output=True, text=True)
    assert done.returncode == 5 and "no tests collected" in done.stdout, done.stdout[-2000:]  # 5: none collected


def test_the_tests_mirror_the_package():
    """A test file in tests/<folder>/ tests the package trl_multiturn/<folder>/ (tests/rollout/ for the rollout,
    tests/envs/swegym/ for SWE-Gym), so a module's tests are found by its path; the top-level modules' tests and the
    whole package's sit in tests/ itself. No two test files share a name: pytest imports a test module by it."""
    from collections import Counter
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    package = tests.parent / "trl_multiturn"
    files = sorted(tests.rglob("test_*.py"))
    nested = [path for path in files if path.parent != tests]
    assert len(nested) > len(files) // 2  # the walk found the sub-folders' files
    misplaced = [str(path.relative_to(tests)) for path in nested
                 if not (package / path.parent.relative_to(tests) / "__init__.py").is_file()]
    assert not misplaced, (f"{misplaced}: trl_multiturn/ has no package of that path; put each in the folder of the "
                           "package it tests (tests/ itself for a top-level module)")
    shared = sorted(name for name, count in Counter(path.name for path in files).items() if count > 1)
    assert not shared, f"test files of one name in two folders: {shared}"
