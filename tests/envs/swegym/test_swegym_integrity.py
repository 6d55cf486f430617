"""The pure parts of SWE-Gym's grading integrity: which paths a patch may not change, canary planting, and how the
runner's report is read and judged. (The attacks themselves, in sandboxes: test_swegym_attacks.py.)"""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from trl_multiturn.envs.swegym import grading
from trl_multiturn.envs.swegym.grading import log_lines, split_test_cmd
from trl_multiturn.envs.swegym.integrity import Canary, judge, plant_canaries, protected_reason, read_report


@pytest.mark.parametrize(
    "path",
    ["conftest.py", "pkg/sub/conftest.py", "pytest.ini", "sub/tox.ini", "setup.cfg", "pyproject.toml", "pytest.toml",
     "sitecustomize.py", "pkg/usercustomize.py", "x.pth", "pkg.egg-info/entry_points.txt", "a.dist-info/METADATA",
     "tests", "tests/helpers.py", "src/testing/x.py", "pkg/test_util.py", "pkg/util_test.py", "__init__.py",
     ".git/config", "docs/the_test_patch_file.txt", "pytest.py", "_pytest/__init__.py", "pluggy.py", "py.py",
     "inspect.py", "json/__init__.py"],
)
def test_protected_paths(path):
    assert protected_reason(path, {"docs/the_test_patch_file.txt"})


@pytest.mark.parametrize("path", ["pkg/core.py", "pkg/__init__.py", "README.md", "pkg/contest.py", "pkg/tested.py",
                                  "latest/x.py", "pkg/testsuite_helpers.py", "setup.py"])
def test_source_paths_are_free(path):
    assert protected_reason(path) is None


SOURCE = '''"""Tests of the module."""
from __future__ import annotations

import pytest

from pkg import core


@pytest.mark.parametrize("x", [1, 2])
def test_core_round_trip(x):
    assert core.f(x) == x


class TestGroup:
    def test_inside(self):
        assert True


def test_empty_input():
    assert core.f(0) == 0'''


def test_canaries_go_between_top_level_statements_and_behave(tmp_path):
    seen_spots = set()
    for seed in range(20):
        text, canaries = plant_canaries("tests/test_core.py", SOURCE, random.Random(seed))
        assert [c.must_pass for c in canaries] == [True, False]
        assert all(c.nodeid.startswith("tests/test_core.py::test_") for c in canaries)
        names = [c.nodeid.split("::")[1] for c in canaries]
        assert len(set(names)) == 2 and not {"test_core_round_trip", "test_empty_input"} & set(names)
        lines = text.splitlines()
        assert lines[:2] == SOURCE.splitlines()[:2]  # docstring and __future__ import stay first
        compile(text, "test_core.py", "exec")
        assert text.count("    import pkg\n") == 2  # both canaries refer to the package the tests import
        seen_spots.add(tuple(i for i, line in enumerate(lines) if line.startswith(f"def {names[0]}")))
    assert len(seen_spots) > 2  # the places vary

    (tmp_path / "tests").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "core.py").write_text("def f(x):\n    return x\n")
    (tmp_path / "tests" / "test_core.py").write_text(text)
    run = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests/test_core.py"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert f"PASSED {canaries[0].nodeid}" in run.stdout and f"FAILED {canaries[1].nodeid}" in run.stdout
    assert "5 passed" in run.stdout and "1 failed" in run.stdout


def test_a_broken_file_still_gets_canaries_at_its_end():
    text, canaries = plant_canaries("tests/test_x.py", "def test_a(:\n", random.Random(0))
    assert text.startswith("def test_a(:\n") and len(canaries) == 2


CANARIES = [Canary("t.py::test_ok", True), Canary("t.py::test_bad", False), Canary("u.py::test_ok2", True),
            Canary("u.py::test_bad2", False)]
HONEST = {"t.py::test_ok": "PASSED", "t.py::test_bad": "FAILED", "u.py::test_ok2": "PASSED",
          "u.py::test_bad2": "FAILED", "t.py::test_fix": "PASSED", "u.py::test_other": "FAILED"}


def _report(outcomes: dict, exit_code: int | None = 1, token: str = "tok", extra: str = "", after: str = "") -> str:
    """The channel's text: a record per outcome, `extra` lines, the end record (unless `exit_code` is None), then
    `after`."""
    lines = [f'{token} {{"test": "{t}", "status": "{s}"}}' for t, s in outcomes.items()]
    if extra:
        lines.append(extra.rstrip("\n"))
    if exit_code is not None:
        lines.append(f'{token} {{"exit": {exit_code}}}')
    return "\n".join(lines) + "\n" + after


def test_an_honest_report_is_trusted_without_its_canaries():
    trusted, problem = judge(read_report(_report(HONEST), "tok"), CANARIES)
    assert problem == "" and trusted == {"t.py::test_fix": "PASSED", "u.py::test_other": "FAILED"}


@pytest.mark.parametrize("status", ["PASSED", "XPASS", "XFAIL"])
def test_a_passing_must_fail_canary_is_tampering(status):
    trusted, problem = judge(read_report(_report({**HONEST, "u.py::test_bad2": status}), "tok"), CANARIES)
    assert problem.startswith("tampering") and set(trusted.values()) == {"FAILED"}


def test_lines_without_the_token_are_forgeries():
    report = read_report(_report(HONEST, extra='other {"test": "t.py::test_fix", "status": "PASSED"}\n'), "tok")
    assert report.forged_lines == 1 and report.outcomes == HONEST
    trusted, problem = judge(report, CANARIES)
    assert problem.startswith("tampering: 1 lines") and set(trusted.values()) == {"FAILED"}
    assert read_report(_report(HONEST, token="wrong"), "tok").outcomes == {}


def test_a_signed_record_the_decoder_cannot_read_is_a_forgery_not_a_crash():
    """A record nested deeper than the JSON decoder's stack (RecursionError, not a decoding error) signed with the
    stolen token: before wave 10 it escaped `read_report`, so a patch could turn its own 0 into an infrastructure
    failure (an episode left out of the loss) at will."""
    deep = "tok {\"x\": " + "[" * 100_000 + "]" * 100_000 + "}\n"
    report = read_report(_report(HONEST, extra=deep), "tok")
    assert report.forged_lines == 1 and report.outcomes == HONEST
    assert judge(report, CANARIES)[1].startswith("tampering: 1 lines")


def test_the_swebench_log_holds_the_rows_tests_with_swebenchs_statuses_only():
    """What swebench's parser reads is the host's writing: a test the report named that is not the row's, a status
    that is not swebench's (one holding a line of its own), or a test not reported never becomes a passing line."""
    from swebench.harness.log_parsers.python import parse_log_pytest

    outcomes = {"t.py::test_fix": "SKIPPED\nPASSED t.py::test_fix", "x\nPASSED t.py::test_other": "SKIPPED",
                "t.py::test_kept": "PASSED", "t.py::test_xfail": "XFAIL", "t.py::test_x": "XPASS"}
    tests = ["t.py::test_fix", "t.py::test_other", "t.py::test_kept", "t.py::test_xfail", "t.py::test_x",
             "t.py::test_missing"]
    lines = log_lines(outcomes, tests)
    assert lines == ["FAILED t.py::test_fix", "FAILED t.py::test_other", "PASSED t.py::test_kept",
                     "XFAIL t.py::test_xfail", "FAILED t.py::test_x", "FAILED t.py::test_missing"]
    assert parse_log_pytest("\n".join(lines), None) == dict(zip(tests, (line.split()[0] for line in lines)))


def test_records_after_the_end_record_are_forgeries_even_with_the_token():
    """The runner writes nothing after its end record: whatever comes after it (code run at exit that rewrites the
    report with a stolen token) is forged, and changes no outcome."""
    forged = "".join(f'tok {{"test": "{t}", "status": "PASSED"}}\n' for t in HONEST) + 'tok {"exit": 0}\n'
    report = read_report(_report(HONEST, after=forged), "tok")
    assert report.forged_lines == len(HONEST) + 1 and report.outcomes == HONEST and report.exit_code == 1
    trusted, problem = judge(report, CANARIES)
    assert problem.startswith("tampering: 7 lines") and set(trusted.values()) == {"FAILED"}


def test_an_audit_record_of_the_runner_is_tampering_and_a_forged_one_a_forgery():
    audit = 'tok {"audit": "sys._getframe", "where": "pkg/core.py:12", "what": ""}\n'
    report = read_report(_report(HONEST, extra=audit), "tok")
    trusted, problem = judge(report, CANARIES)
    assert problem.startswith("tampering: the patch's code reached into the test run (sys._getframe")
    assert "pkg/core.py:12" in problem and set(trusted.values()) == {"FAILED"}
    assert judge(read_report(_report(HONEST, extra=audit.replace("tok", "bad")), "tok"), CANARIES)[1].startswith(
        "tampering: 1 lines")


def test_an_unfinished_run_fails_and_a_broken_file_fails_alone():
    trusted, problem = judge(read_report(_report(HONEST, exit_code=None), "tok"), CANARIES)
    assert problem == "the test run ended before pytest finished" and set(trusted.values()) == {"FAILED"}
    no_u_canaries = {t: s for t, s in HONEST.items() if not t.startswith("u.py::test_") or t == "u.py::test_other"}
    trusted, problem = judge(read_report(_report(no_u_canaries), "tok"), CANARIES)
    assert problem == "the tests of ['u.py'] did not run properly"
    assert trusted == {"t.py::test_fix": "PASSED", "u.py::test_other": "FAILED"}


@pytest.mark.parametrize("cmd, split", [
    ("pytest -rA", ([], "python", ["-rA"])),
    ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -x -q", (["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"], "python3",
                                                                   ["-x", "-q"])),
])
def test_test_commands_split_into_pytest_arguments(cmd, split):
    assert split_test_cmd(cmd) == split


@pytest.mark.parametrize("cmd", ["./tests/runtests.py", "tox -e py", "python setup.py test", "make test"])
def test_other_test_commands_are_refused_with_the_form_to_use(cmd):
    with pytest.raises(ValueError, match="test_cmd=.*python -m pytest ARGS"):
        split_test_cmd(cmd)


def test_the_runner_imports_the_real_pytest_before_the_working_folder_is_on_sys_path(tmp_path):
    """A `pytest.py` in the folder the tests run in must not stand in for pytest (it would forge the records)."""
    (tmp_path / "pytest.py").write_text("import os\nos._exit(7)\n")
    (tmp_path / "test_a.py").write_text("def test_a():\n    assert True\n")
    report = run_runner(tmp_path, ["test_a.py"])
    assert report.outcomes == {"test_a.py::test_a": "PASSED"} and report.exit_code == 0


def run_runner(folder: Path, tests: list[str], added: dict | None = None, known: list[str] | None = None):
    """Run pytest_runner.py in `folder` on `tests`, with `added` ({path: [[first, last]]}) as the patch's lines and
    `known` the Python files of the base commit (by default every Python file in `folder`); its report. (In grading
    it runs in a sandbox; here the runner alone is under test.)"""
    scratch = folder.parent / f"{folder.name}-scratch"  # grading's scratch folder is outside the checkout
    scratch.mkdir()
    (scratch / "token").write_text("tok")
    if known is None:
        known = [str(p.relative_to(folder)) for p in folder.rglob("*.py")]
    (scratch / "audit.json").write_text(json.dumps({"added": added or {}, "known": known, "tests": tests}))
    runner = Path(grading.__file__).with_name("pytest_runner.py")
    with open(scratch / "report", "wb") as report:  # the channel's bytes, as the host would receive them
        run = subprocess.run([sys.executable, "-s", str(runner), str(scratch / "token"), str(report.fileno()),
                              str(scratch / "audit.json"), "-p", "no:cacheprovider", *tests], cwd=folder,
                             capture_output=True, text=True, timeout=300, pass_fds=[report.fileno()])
    assert run.returncode in (0, 1), run.stdout + run.stderr
    assert not (scratch / "token").exists() and not (scratch / "audit.json").exists()  # gone before any test ran
    return read_report((scratch / "report").read_text(), "tok")


@pytest.mark.parametrize("folder", ["pkg.egg-info", "Pkg.EGG-INFO", "pkg-1.0.Dist-Info", "PKG-1.0.DIST-INFO",
                                    "pkg-1.0.Egg-Info"])
def test_metadata_folders_are_protected_as_importlib_metadata_finds_them(folder, tmp_path):
    """importlib.metadata lower-cases folder names before matching them, and so does the protection: every spelling
    it loads an entry point from is protected."""
    import importlib.metadata

    path = f"{folder}/entry_points.txt"
    (tmp_path / folder).mkdir()
    (tmp_path / path).write_text("[pytest11]\nspeedups = pkg._speedups\n")
    (tmp_path / folder / ("PKG-INFO" if "egg" in folder.lower() else "METADATA")).write_text(
        "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    found = [ep for dist in importlib.metadata.distributions(path=[str(tmp_path)]) for ep in dist.entry_points]
    assert [ep.value for ep in found] == ["pkg._speedups"]  # the folder is one importlib.metadata reads
    assert protected_reason(path) and protected_reason(f"src/{path}")


def test_diff_header_paths_are_read_as_git_quotes_them():
    """A file named with a quote or a non-ASCII character is C-quoted in `git diff`'s header: its added lines are
    still the runner's to audit."""
    assert grading._unquoted("b/pkg/core.py") == "b/pkg/core.py"
    assert grading._unquoted('"b/pkg/we\\"ird.py"') == 'b/pkg/we"ird.py'
    assert grading._unquoted('"b/pkg/\\303\\251t\\303\\251.py"') == "b/pkg/été.py"
