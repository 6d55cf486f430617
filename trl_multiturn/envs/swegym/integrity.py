"""What keeps the agent's patch from steering its own grading: pure functions that `grading.py` applies.

1. `protected_reason(path)`: files a fix has no business changing because they steer pytest or Python rather
   than the code under test (tests, pytest configuration, conftest.py, start-up hooks, package metadata).
   Grading restores them to the base commit, or removes them when the patch added them, before the tests run.
2. Canary tests (`plant_canaries`): each test file of the run gets, at random top-level places, a test that
   must pass and one that must fail, named like the file's own tests and importing the package under test.
   Agent code that tampers with the test run from inside it (a hook that marks every test passed, an import hook
   that empties test functions, a patched pytest, even when only for tests that refer to the package) makes the
   failing canary pass, and the whole run then scores 0.
3. The report (`read_report`, `judge`): outcomes come only from the token-signed records of `pytest_runner.py`,
   received on the sandbox's channel as they were written, never from the text the tests print; a report with
   lines the runner did not write or records after its end record, or that did not reach its end record, counts
   as failed.
4. Values (`judge_values`): the barrier. A test passes only when the values its checks looked at in the patch's
   run, reported in observation form (`observe.py`: no expected value is in that sandbox), are those of the gold
   patch's run of the same text in a sandbox of its own; 1-3 and the runner's audit hook are signals that score a
   run they catch 0, never what makes a pass.
"""

from __future__ import annotations

import ast
import json
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import PurePosixPath

CONFIG_FILES = {"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml"}
STARTUP_HOOKS = {"sitecustomize.py", "usercustomize.py"}
# What the test run imports before or besides the code under test: a module of that name at the repository root
# (first on sys.path) would stand in for it.
HARNESS_MODULES = {"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "swebench"}
TEST_FOLDERS = {"test", "tests", "testing"}


def protected_reason(path: str, test_files: frozenset[str] | set[str] = frozenset()) -> str | None:
    """Why a patch may not change `path` (relative to the repository root), or None when it may."""
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    if path in test_files:
        return "a file of the test patch"
    if ".git" in parts:
        return "git's own files"
    if name == "conftest.py":
        return "a conftest.py (pytest loads it as a plugin)"
    if name in CONFIG_FILES:
        return "pytest configuration"
    if name in STARTUP_HOOKS or name.endswith(".pth"):
        return "a Python start-up hook"
    if any(is_metadata_folder(part) for part in parts):
        return "package metadata (its entry points can load pytest plugins)"
    if any(part in TEST_FOLDERS for part in parts):
        return "the test suite"
    if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
        return "a test module"
    if path == "__init__.py":
        return "a package marker at the repository root (it renames the test modules)"
    top = parts[0].removesuffix(".py") if parts else ""
    if (len(parts) > 1 or parts[0].endswith(".py")) and (top in HARNESS_MODULES or top in sys.stdlib_module_names):
        return "a module at the repository root named like one of pytest's or Python's own (it would shadow it)"
    return None


def is_metadata_folder(name: str) -> bool:
    """Whether `importlib.metadata` reads a folder (or file) of this name as a distribution's metadata: it lower-cases
    the name before matching (`Lookup` in importlib.metadata), so `Pkg.EGG-INFO` and `pkg.Dist-Info` count, and
    an egg (`x.egg`) holds its metadata in `EGG-INFO`."""
    low = name.lower()
    return low.endswith((".egg-info", ".dist-info", ".egg")) or low == "egg-info"


@dataclass(frozen=True)
class Canary:
    nodeid: str
    must_pass: bool


_WORDS = ("value", "case", "input", "result", "empty", "single", "order", "format", "parse", "basic", "edge",
          "round", "trip", "default", "limit", "mixed")


def _insertion_lines(tree: ast.Module) -> list[int]:
    """0-based line numbers where a top-level test function may go: before any top-level statement after the
    docstring and `from __future__` imports, or at the end of the file."""
    body = list(tree.body)
    while body and (
        (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value,
                                                                                               str))
        or (isinstance(body[0], ast.ImportFrom) and body[0].module == "__future__")
    ):
        body.pop(0)
    lines = []
    for node in body[1:]:
        if node.col_offset == 0:
            decorators = getattr(node, "decorator_list", [])
            lines.append(min([node.lineno, *(d.lineno for d in decorators)]) - 1)
    return lines


def imported_packages(tree: ast.Module) -> list[str]:
    """The top-level modules `tree` imports (absolutely) that are neither the standard library nor pytest's."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if n not in sys.stdlib_module_names and n not in HARNESS_MODULES)


def plant_canaries(path: str, source: str, rng: random.Random) -> tuple[str, list[Canary]]:
    """`source` (test module `path`) with a must-pass and a must-fail canary test inserted; the canaries.

    Each canary imports one of the packages the file's tests import, so that agent code which tampers only with
    the tests that refer to its package tampers with the canaries too."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
    names = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    words = sorted({w for n in names if n.startswith("test_") for w in n.split("_")[1:] if w.isalpha()})
    words = words or list(_WORDS)
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    spots = [*_insertion_lines(tree), len(lines)]
    packages = imported_packages(tree)
    canaries, inserts = [], []
    for must_pass in (True, False):
        name = ""
        while not name or name in names:
            name = "test_" + "_".join(rng.sample(words, min(2, len(words)))) + ("" if rng.random() < 0.5 else
                                                                                 f"_{rng.choice(_WORDS)}")
        names.add(name)
        a, b = rng.randrange(2, 99), rng.randrange(2, 99)
        expected = a + b if must_pass else a + b + rng.randrange(1, 9)
        body = f"    assert {a} + {b} == {expected}\n"
        if packages:  # the canary refers to the code under test, as the file's own tests do
            package = rng.choice(packages)
            body = f"    import {package}\n\n    assert {package}.__name__ == {package!r}\n{body}"
        inserts.append((rng.choice(spots), f"\n\ndef {name}():\n{body}\n\n"))
        canaries.append(Canary(f"{path}::{name}", must_pass))
    for spot, text in sorted(inserts, key=lambda item: item[0], reverse=True):
        lines.insert(spot, text)
    return "".join(lines), canaries


def test_files_of(test_ids: list[str]) -> list[str]:
    """The files the pytest node ids live in, in order of first appearance."""
    return list(dict.fromkeys(t.split("::")[0] for t in test_ids if "::" in t))


PASSING = ("PASSED", "XPASS", "XFAIL")
# What a test's values record holds (`pytest_runner._Observations.take`): how many values, a sha256 over them, and
# how many of its checks were blind; two runs' values are the same when all three are.
VALUE_KEYS = ("count", "digest", "blind")
_RECORD = re.compile(r"^(\S+) (\{.*\})$")


@dataclass
class Report:
    """What `pytest_runner.py` recorded: outcomes by node id, pytest's exit code (None when the run never
    reached its end), and how many lines of the channel were not the runner's (forged: lines without the token,
    and records after the end record, when the runner has stopped writing, but audit records)."""

    outcomes: dict[str, str]
    exit_code: int | None
    forged_lines: int
    audits: list[dict] = field(default_factory=list)
    values: dict[str, dict] = field(default_factory=dict)


def read_report(text: str | None, token: str) -> Report:
    """The records of `text` that carry `token`; every other non-empty line counts as forged (one the decoder
    cannot read too, whatever the reason), and so does any record after the end record but an audit record (the
    audit hook still records code the patch runs at exit)."""
    report = Report({}, None, 0)
    for line in (text or "").splitlines():
        match = _RECORD.match(line)
        record = None
        if match is not None and match.group(1) == token:
            try:
                record = json.loads(match.group(2))
            except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder's stack
                record = None
        if isinstance(record, dict) and report.exit_code is not None and not isinstance(record.get("audit"), str):
            record = None  # the runner's `main` has returned: nothing else of its writes after the end record
        if not isinstance(record, dict):
            report.forged_lines += bool(line.strip())
        elif isinstance(record.get("test"), str) and isinstance(record.get("status"), str):
            report.outcomes[record["test"]] = record["status"]
        elif isinstance(record.get("values"), str):
            report.values[record["values"]] = {key: record.get(key) for key in VALUE_KEYS}
        elif isinstance(record.get("exit"), int):
            report.exit_code = record["exit"]
        elif isinstance(record.get("audit"), str):
            report.audits.append(record)
    return report


def judge(report: Report, canaries: list[Canary]) -> tuple[dict[str, str], str]:
    """The outcomes grading may trust, without the canaries, and what was wrong with the run ("" if nothing).

    Forged lines in the report, an audit record (the patch's added code looked into the test process: frames,
    code, object scans, the runner's internals, see `pytest_runner.py`), or a must-fail canary reported as passing
    (PASSED, XPASS, or XFAIL, which swebench counts as a pass), mean the run was tampered with: every test counts as
    failed. A run without its end record did not finish: likewise. A file whose must-pass canary did not pass (or
    whose canaries never ran) did not run properly: its tests count as failed.
    """
    outcomes = report.outcomes
    real = {t: s for t, s in outcomes.items() if t not in {c.nodeid for c in canaries}}
    failed_all = {t: "FAILED" for t in real}
    if report.forged_lines:
        return failed_all, f"tampering: {report.forged_lines} lines of the test report were not the runner's"
    if report.audits:
        first = report.audits[0]
        return failed_all, (f"tampering: the patch's code reached into the test run ({first['audit']} "
                            f"{first.get('what', '')} at {first.get('where', '?')}; {len(report.audits)} such "
                            "events in all)")
    tampered = [c.nodeid for c in canaries if not c.must_pass and outcomes.get(c.nodeid) in PASSING]
    if tampered:
        return failed_all, f"tampering: a test written to fail was reported {outcomes[tampered[0]]} ({tampered[0]})"
    if report.exit_code is None:
        return failed_all, "the test run ended before pytest finished"
    broken = {c.nodeid.split("::")[0] for c in canaries
              if outcomes.get(c.nodeid) != ("PASSED" if c.must_pass else "FAILED")}
    if broken:
        trusted = {t: ("FAILED" if t.split("::")[0] in broken else s) for t, s in real.items()}
        return trusted, f"the tests of {sorted(broken)} did not run properly"
    return real, ""


def is_unobserved(values: dict | None) -> bool:
    """Whether a test's values (`VALUE_KEYS`), as the gold run reported them, cannot decide it: it
    reported no value at all (a check the observation form cannot report, such as one using `:=`), or one of its
    checks was blind (`pytest_runner._Observations`: what decides it is the package's operator against a value the
    form dropped, or a value too deep to write)."""
    return values is None or not values["count"] or bool(values["blind"])


def judge_values(outcomes: dict[str, str], values: dict, gold_outcomes: dict[str, str], gold_values: dict,
                 tests: list[str]) -> dict[str, str]:
    """The outcome of each of `tests` that grading trusts: PASSED only where the patch's run reported a pass and
    the same values (count, digest and blind checks, `pytest_runner._Observations`) as the gold patch's run of
    the same text, where that test passed too; otherwise the patch's own outcome if it is not a pass, else FAILED.
    A test whose gold values are unobserved (`is_unobserved`) is FAILED whatever was reported, FAIL_TO_PASS and
    PASS_TO_PASS alike: with nothing to compare, its pass would rest on the patch's word alone (a patch that
    breaks what a PASS_TO_PASS test checks and fakes its pass from inside the test process would keep the
    reward); the row's author sees it among `unobserved_tests`.

    Nothing the patch's run says can make a test pass unless its values are the gold patch's: the observation form
    (`observe.py`) left no expected value in its sandbox, so a report it forged, rewrote or signed with a stolen
    token can only hold values it computed, read or guessed."""
    trusted = {}
    for test in tests:
        status = outcomes.get(test, "FAILED")
        vouched = (gold_outcomes.get(test) in PASSING and not is_unobserved(gold_values.get(test))
                   and values.get(test) == gold_values[test])
        if status in PASSING and not vouched:
            status = "FAILED"
        trusted[test] = status
    return trusted
