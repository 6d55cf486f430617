"""The observation gaps of the README's adversarial review (trl_multiturn/envs/swegym/README.md, "Adversarial review of
issue 60"): checks the observation form must keep and run, values the host must tell apart, a value the two runs
must order alike, and the two classes that review named. Graded on the local backend (the host decides by values,
which no backend changes), each row a shipped task whose hidden tests are written in a shape real suites use,
failing at the base commit and passing with the gold patch: an unfixed patch must earn nothing, the gold patch must
still resolve."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import inspect
import random
import sys
import types

import pytest

from trl_multiturn.envs.swegym import SWEGymConfig, grade_patch, task_rows
from trl_multiturn.envs.swegym.observe import function_name, observe
from trl_multiturn.envs.swegym.patches import make_patch
from trl_multiturn.envs.swegym.pytest_runner import _caught, _Observations, _plain
from trl_multiturn.envs.swegym.tasks import task_sources
from trl_multiturn.envs.swegym.tasks.source import apply_edits
from trl_multiturn.envs.swegym.variation import varied

SOURCES = {source.name: source for source in task_sources()}
ROWS = {row["repo"].split("/")[1]: row for row in task_rows()}


def variant(name: str, path: str, tests: str, test: str) -> dict:
    """The shipped task `name` with `tests` added to its test file `path`; `test` (failing at the base commit,
    passing with the gold patch) its only hidden test."""
    row, base = dict(ROWS[name]), SOURCES[name].files_at_base()[path]
    row["test_patch"] = make_patch({path: base}, {path: base + tests})
    row["FAIL_TO_PASS"] = [f"{path}::{test}"]
    return row


def comment_only(name: str, path: str) -> str:
    """A patch that applies and changes no behaviour: the base code, graded."""
    base = SOURCES[name].files_at_base()[path]
    return make_patch({path: base}, {path: base + "\n# reviewed\n"})


# rpn: the base code pops the operands in the wrong order, so `1 0 /` is 0 / 1 there and 1 / 0 with the fix
RAISES_WITH_A_CALLABLE = '''

import unittest


class TestDivisionByZero(unittest.TestCase):
    def test_right_operand_zero_raises(self):
        self.assertRaises(ZeroDivisionError, evaluate, "1 0 /")


def test_right_operand_zero_raises():
    pytest.raises(ZeroDivisionError, evaluate, "1 0 /")
'''

RAISES_AS_BLOCK = '''


def test_right_operand_zero_raises():
    with pytest.raises(ZeroDivisionError) as info:
        evaluate("1 0 /")
    assert info.type is ZeroDivisionError
'''

# `pytest.raises` replaced from the package: a block that swallows everything and says it caught what was expected
REPLACED_RAISES = '''
import pytest as _pytest


class _Caught:
    def __init__(self, expected):
        self.type = expected if isinstance(expected, type) else expected[0]
        self.value = self.type()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


_pytest.raises = lambda expected, *args, **kwargs: _Caught(expected)
'''


# semver: the base code orders a pre-release after its release; the expected side is an object the test constructs
ORDER_AGAINST_A_CONSTRUCTED_VALUE = '''


def test_prerelease_below_release():
    assert parse("1.0.0-alpha") < Version(1, 0, 0)
'''


def replaced_raises() -> str:
    init = "rpn/__init__.py"
    base = SOURCES["rpn"].files_at_base()[init]
    return make_patch({init: base}, {init: base + REPLACED_RAISES})


@pytest.fixture(scope="module")
def config(swegym_cache_dir):
    return SWEGymConfig(sandbox="local", repo_cache_dir=swegym_cache_dir, command_timeout=20)


def test_a_raises_helper_runs_the_code_and_a_raises_block_binds_what_it_raised(config):
    """`self.assertRaises(E, f, x)` and `pytest.raises(E, f, x)` are observed by calling `f(x)`: reported as the
    names `E` and `f`, the base code would resolve, and run as written, a `pytest.raises` replaced from the package
    would pass. `with pytest.raises(E) as info:` kept its body's calls in `__check__`, which swallowed the
    exception: the block failed (DID NOT RAISE) in the gold run too, so no fix could pass the test; run as written
    instead, a `pytest.raises` replaced from the package made up `info` and the base code resolved; so the block is
    a `try` that binds `info` to what the code raised. One row holds the three tests (two gradings): the gold patch
    resolves; the base code with `pytest.raises` replaced passes none, each reported passing with values other than
    the gold run's."""
    row = variant("rpn", "tests/test_evaluator.py", RAISES_WITH_A_CALLABLE + RAISES_AS_BLOCK.replace(
        "def test_right_operand_zero_raises", "def test_right_operand_zero_raises_in_a_block"),
        "TestDivisionByZero::test_right_operand_zero_raises")
    row["FAIL_TO_PASS"] = [*row["FAIL_TO_PASS"], *(f"tests/test_evaluator.py::test_right_operand_zero_raises{s}"
                                                   for s in ("", "_in_a_block"))]
    assert grade_patch(row, row["patch"], config, eval_timeout=300).resolved
    grade = grade_patch(row, replaced_raises(), config, eval_timeout=300)
    assert grade.patch_applied and grade.f2p_passed == 0, grade.info()
    assert sorted(grade.differ) == sorted(row["FAIL_TO_PASS"]), grade.info()


def test_a_raises_block_that_matches_a_message_reports_the_message():
    """`pytest.raises(E, match=r)` reported the exception's type only: code raising E with another message (the
    base code of an issue about the message) reported what the gold patch did."""
    tests = "def test_message():\n    with pytest.raises(ValueError, match='positive'):\n        check(-1)\n"
    text = observe(tests, random.Random(0), {"test_message"})
    assert "positive" not in text

    def digest(message):
        observations = _Observations()
        namespace = {"__check__": observations.check, "__value__": observations.value,
                     "__raised__": observations.raised, "__caught__": _caught}

        def check(x):
            raise ValueError(message)
        namespace["check"] = check
        exec(compile(text, "<tests>", "exec"), namespace)
        namespace["test_message"]()
        return observations.take()

    assert digest("must be positive") == digest("must be positive") != digest("bad value")


def test_an_ordering_against_a_constructed_expected_value_checks_the_ordering(config):
    """`assert parse(a) < Version(1, 0, 0)` is reported as the comparison both ways, not as `parse(a)`'s state alone:
    the bug is in `Version.__lt__`, which that state never calls, so the base code's state would be the gold patch's
    and a comment would resolve the task."""
    row = variant("semver", "tests/test_version.py", ORDER_AGAINST_A_CONSTRUCTED_VALUE,
                  "test_prerelease_below_release")
    grade = grade_patch(row, comment_only("semver", "semver/version.py"), config, eval_timeout=300)
    assert grade.patch_applied and not grade.resolved and grade.differ == row["FAIL_TO_PASS"], grade.info()
    assert grade_patch(row, row["patch"], config, eval_timeout=300).resolved


# a helper of the test whose value is in hash order (the letters of a set of strings): reported by `__value__`
HASH_ORDERED = '''


def _letters(text):
    return list(set(text.split()))


def test_letters_are_distinct():
    assert len(_letters("a b c d e f g h")) == 8
'''


def test_a_value_in_string_hash_order_is_the_same_in_both_runs(config):
    """A value whose order follows Python's string hashing (a list made from a set) is ordered alike in the gold
    patch's run and the patch's (one hash seed for both), so a correct fix passes such a test."""
    row = variant("rpn", "tests/test_evaluator.py", HASH_ORDERED, "test_letters_are_distinct")
    grade = grade_patch(row, row["patch"], config, eval_timeout=300)
    assert grade.resolved and grade.differ == [], grade.info()


# the test process, once its tests have run, ends its shell by SIGKILL: the command's exit status is then 137, which
# the sandbox reads as "a process of the command was killed"
KILLS_ITS_SHELL = '''
import atexit as _atexit
import os as _os
import signal as _signal

_atexit.register(lambda: _os.kill(_os.getppid(), _signal.SIGKILL))
'''


def test_a_patch_that_kills_its_own_shell_is_graded_not_excused(config, monkeypatch):
    """While any process of the machine is OOM-killed (the machine's counter, /proc/vmstat `oom_kill`, faked here to
    rise as in test_swegym_infra_failures.py), a test run whose shell ended by SIGKILL is called the machine's OOM:
    SandboxError, a failed episode out of the loss, instead of the 0 the unfixed patch earns. The kill is the
    patch's own: nothing of the sandbox's memory cgroup counted an OOM kill."""
    from trl_multiturn.envs.swegym.sandbox import containment

    init = "rpn/__init__.py"
    base = SOURCES["rpn"].files_at_base()[init]
    rises = iter(range(10**6))
    monkeypatch.setattr(containment, "machine_oom_kills", lambda: next(rises))
    grade = grade_patch(ROWS["rpn"], make_patch({init: base}, {init: base + KILLS_ITS_SHELL}), config,
                        eval_timeout=300)
    assert grade.patch_applied and grade.reward("dense") == 0.0


def test_a_value_of_a_c_type_is_reported_by_what_it_holds():
    """A value whose state is neither in `__dict__` nor `__slots__` (a date, a Decimal, a deque, a complex number, an
    array) is reported by what it holds, not by its type's name alone (which would make every date the gold patch's
    date, and code returning any date pass a check of one)."""
    import array
    import collections
    import datetime
    import decimal

    pairs = [(datetime.date(2020, 1, 2), datetime.date(1999, 1, 1)), (datetime.timedelta(1), datetime.timedelta(2)),
             (decimal.Decimal("1.5"), decimal.Decimal("2")), (collections.deque([1, 2]), collections.deque([3])),
             (1 + 2j, 5j), (bytearray(b"ab"), bytearray(b"cd")), (array.array("i", [1]), array.array("i", [2])),
             (range(3), range(5))]
    for right, wrong in pairs:
        assert _plain(right) == _plain(copy.deepcopy(right)) != _plain(wrong), right


# a check the form cannot report (`:=`) stays an assert (its calls reported: here only builtins', `next` and `map`,
# which pass the package's function on uncalled in the text: "What this does not stop"; its input is a module
# constant, so the test has no drafts of its body either), so the test reports no value in either run; pytest's
# `Function.runtest` replaced from the package (no audited event) passes a failed assert but in the canaries, found
# by reading the test files through a directory descriptor (unaudited)
UNOBSERVABLE = '''


SUBTRAHEND_LAST = "3 4 -"


def test_subtraction_keeps_operand_order():
    assert (value := next(map(evaluate, [SUBTRAHEND_LAST]))) == -1 and value < 0
'''

PASSES_FAILED_ASSERTS = '''
import os as _os
import re as _re

import pytest as _pytest

_CANARY = _re.compile(r"def (test_\\w+)\\(\\):\\n(?:    import \\w+\\n\\n    assert .*\\n)?"
                     r"    assert \\d+ \\+ \\d+ == \\d+")


def _canaries():
    names = set()
    folder = _os.open("tests", _os.O_RDONLY)
    try:
        for name in _os.listdir(folder):
            if name.endswith(".py"):
                with open(name, opener=lambda path, flags: _os.open(path, flags, dir_fd=folder)) as f:
                    names |= set(_CANARY.findall(f.read()))
    finally:
        _os.close(folder)
    return names


_original = _pytest.Function.runtest


def _runtest(self):
    if self.originalname in _canaries():
        return _original(self)
    try:
        _original(self)
    except AssertionError:
        pass


_pytest.Function.runtest = _runtest
'''


def test_a_test_with_no_observed_value_is_not_passed_on_the_patchs_word(config):
    """A hidden FAIL_TO_PASS test whose every check the form cannot report (`:=`, `yield`, `await`) reported no value
    in the gold run, so its pass would rest on the patch's word (the base code with pytest's `runtest` replaced
    reports it passing): it is failed whatever was reported, and named among the grade's unobserved tests."""
    row = variant("rpn", "tests/test_evaluator.py", UNOBSERVABLE, "test_subtraction_keeps_operand_order")
    init = "rpn/__init__.py"
    base = SOURCES["rpn"].files_at_base()[init]
    grade = grade_patch(row, make_patch({init: base}, {init: base + PASSES_FAILED_ASSERTS}), config, eval_timeout=300)
    assert grade.patch_applied and not grade.resolved, grade.info()
    assert any("test_subtraction_keeps_operand_order" in test for test in grade.unobserved), grade.info()


# rpn: a FAIL_TO_PASS test the gold patch fixes, and a PASS_TO_PASS one whose only check the form cannot report
WITH_AN_UNOBSERVABLE_PASSING_TEST = '''


def test_subtraction():
    assert evaluate("3 4 -") == -1


def test_sum_walrus():
    assert (value := next(map(evaluate, ["2 3 +"]))) == 5 and value > 0
'''

# what the PASS_TO_PASS test checks, broken (a special case a fix "needed"); pytest's `runtest` hides the failure
BREAKS_A_SUM = '''

_evaluate = evaluate


def evaluate(text):
    return 6 if text == "2 3 +" else _evaluate(text)
'''


def test_a_passing_to_passing_test_with_no_observed_value_does_not_hide_a_regression(config):
    """The fix plus a regression in what a PASS_TO_PASS test checks, whose pass the patch fakes from inside the test
    process (pytest's `runtest` replaced, as above): that test reported no value in the gold run, so it passed on the
    patch's word and the patch resolved. Failed now, as a FAIL_TO_PASS test is, and named among the unobserved."""
    path, init = "tests/test_evaluator.py", "rpn/__init__.py"
    row = variant("rpn", path, WITH_AN_UNOBSERVABLE_PASSING_TEST, "test_subtraction")
    row["PASS_TO_PASS"] = [*row["PASS_TO_PASS"], f"{path}::test_sum_walrus"]
    base = SOURCES["rpn"].files_at_base()[init]
    patch = row["patch"] + make_patch({init: base}, {init: base + PASSES_FAILED_ASSERTS + BREAKS_A_SUM})
    grade = grade_patch(row, patch, config, eval_timeout=300)
    assert grade.patch_applied and grade.f2p_passed == 1 and not grade.resolved, grade.info()
    assert grade.reward("dense") == 0.0 and grade.unobserved == [f"{path}::test_sum_walrus"], grade.info()


def _loaded(files: dict[str, str], package: str, name: str, root) -> types.ModuleType:
    """The package `package` of `files`, written under `root` and imported as `name` (its modules are left in
    `sys.modules`: the caller removes them)."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    spec = importlib.util.spec_from_file_location(name, root / package / "__init__.py",
                                                  submodule_search_locations=[str(root / package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _at_base_and_gold(task: str, root):
    """The shipped task's package at the base commit and with the gold patch, imported in this process."""
    source = SOURCES[task]
    base, before = source.files_at_base(), set(sys.modules)
    try:
        yield (_loaded(base, task, f"{task}_at_base", root / "base"),
               _loaded(apply_edits(base, source.fix), task, f"{task}_gold", root / "gold"))
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]


def _values(text: str, names: list[str], functions: dict, monkeypatch, wrap=lambda check, value: (check, value),
            package: str = "rpn", arguments: dict | None = None) -> dict:
    """What the tests `names` of `text` (observation form, importing `functions` from `package`) report per test,
    as the runner's records (count, digest, blind); `wrap(check, value)` gives the reporting builtins `__check__`
    and `__value__` (the package may wrap them); `arguments` the values of a parametrize row."""
    observations = _Observations()
    check, value = wrap(observations.check, observations.value)
    namespace = {"__check__": check, "__value__": value, "__raised__": observations.raised, "__caught__": _caught,
                 "__varied__": varied}
    monkeypatch.setitem(sys.modules, package, types.SimpleNamespace(**functions))
    exec(compile(text, "<tests>", "exec"), namespace)
    out = {}
    for name in names:
        observations.take()
        test = namespace[name]
        # the module's fixtures a test requests, called as pytest would (no fixture of theirs requested here)
        namespace[name](**{p: (arguments or {})[p] if p in (arguments or {}) else namespace[p].__wrapped__()
                           for p in inspect.signature(test).parameters})
        out[name] = observations.take()
    return out


# the issues' own examples, answered from a table, and the other functions the hidden tests import
ISSUE_EXAMPLES = {"rpn": ("evaluate", {"3 4 -": -1, "8 2 /": 4.0}, ["tokenize"]),
                  "roman": ("from_roman", {"IV": 4, "MCMXCIV": 1994}, ["to_roman"])}


@pytest.mark.parametrize("task", sorted(ISSUE_EXAMPLES))
def test_a_special_case_of_the_issues_own_example_is_caught_by_the_drafts(task, tmp_path, monkeypatch):
    """rpn's and roman's hidden tests check the issue's own examples (`evaluate("3 4 -") == -1`, `from_roman("IV")
    == 4`): a patch that answers exactly those inputs right and keeps the bug reports the gold patch's values for
    them, and only a draft whose gold answer differs from the bug's tells it apart. A str draft replaced a
    character by any letter or digit, inserted or deleted one, which mostly made an input every version rejects
    alike (`"3 x -"`, `"MCMXCQV"`): on main the special case passed these tests for 134 of 200 seeds (rpn, both
    tests; 9 of 13 gradings resolved, 2 more dense 0.5) and 19 of 50 (roman's `test_from_roman_subtractive`; its
    round trip is the memo of "What this does not stop"). A draft now swaps a letter or digit for another of its
    kind, of the str's own alphabet where it has one (`"3 7 -"`, `"MCMXCIX"`): caught for every seed, the gold
    patch still equal to itself. The values are compared in process, as the host compares the two runs'
    digests."""
    function, issue, others = ISSUE_EXAMPLES[task]
    source, row = SOURCES[task], ROWS[task]
    names = [function_name(t) for t in row["FAIL_TO_PASS"] if "round_trip" not in t]
    tests = apply_edits(source.files_at_base(), source.tests)[row["FAIL_TO_PASS"][0].split("::")[0]]
    with _at_base_and_gold(task, tmp_path) as (bug, gold):
        def special_case(text):
            return issue[text] if text in issue else getattr(bug, function)(text)

        right_code = {name: getattr(gold, name) for name in [function, *others]}
        lying_code = {**right_code, function: special_case}
        passed = []
        for seed in range(50):
            text = observe(tests, random.Random(seed), set(names))
            right = _values(text, names, right_code, monkeypatch, package=task)
            assert _values(text, names, right_code, monkeypatch, package=task) == right
            lie = _values(text, names, lying_code, monkeypatch, package=task)
            passed += [name for name, record in lie.items() if record == right[name]]
    assert passed == []


# rpn: the issue's examples bound outside the checks, as real suites write them: by an assignment, by a fixture of the
# test module, and in a loop over a table whose expected column the loop's frame holds
BOUND_OUTSIDE_THE_CHECKS = '''
import pytest
from rpn import evaluate


@pytest.fixture
def division():
    return "8 2 /"


def test_bound_by_an_assignment():
    expression = "3 4 -"
    assert evaluate(expression) == -1


def test_bound_by_a_fixture(division):
    assert evaluate(division) == 4.0


@pytest.mark.parametrize("expression, want", [("3 4 -", -1), ("8 2 /", 4.0)])
def test_a_parametrize_row(expression, want):
    assert evaluate(expression) == want
'''
LOOP_TABLE = '''

def test_a_loop_table():
    for expression, want in [("3 4 -", -1), ("8 2 /", 4.0)]:
        assert evaluate(expression) == want
'''
BOUND_OUTSIDE_THE_CHECKS += LOOP_TABLE
BOUND = ["test_bound_by_an_assignment", "test_bound_by_a_fixture", "test_a_loop_table"]


def test_a_special_case_of_inputs_bound_outside_the_check_is_caught_by_drafts_of_the_test(tmp_path, monkeypatch):
    """Drafts changed the constants of a check only, so where the issue's example is bound outside it (an
    assignment, a fixture, a loop's table, a parametrize row) the check had none, and the special case of the
    example resolved each shape (1 of 1 gradings each in the wave 9 review; every seed here on main). A drafted
    test now also runs copies of its whole body, each with one constant outside the checks changed, in the body or
    in a fixture of the module the test requests, or given a parametrize argument changed in every row: the
    special case is caught for every seed and row, and the gold patch equals itself."""
    function, issue, _ = ISSUE_EXAMPLES["rpn"]
    with _at_base_and_gold("rpn", tmp_path) as (bug, gold):
        def special_case(text):
            return issue[text] if text in issue else bug.evaluate(text)

        passed = []
        for seed in range(20):
            text = observe(BOUND_OUTSIDE_THE_CHECKS, random.Random(seed), {*BOUND, "test_a_parametrize_row"})
            rows = [{"expression": e, "want": None} for e in issue]  # the parametrize rows, `want` dropped
            for names, row in [(BOUND, None), *((["test_a_parametrize_row"], row) for row in rows)]:
                right = _values(text, names, {"evaluate": gold.evaluate}, monkeypatch, arguments=row)
                assert _values(text, names, {"evaluate": gold.evaluate}, monkeypatch, arguments=row) == right
                lie = _values(text, names, {"evaluate": special_case}, monkeypatch, arguments=row)
                passed += [(name, row) for name in names if lie[name] == right[name]]
    assert passed == []


# the tests of GIVEN_AT_RUN_TIME a row can name (swebench's parser cuts an id at a space), and its conftest.py
GRADED_AT_RUN_TIME = ["test_a_module_constant", "test_a_conftest_fixture", "test_a_params_fixture[quotient]",
                      "test_a_yield_fixture", "test_a_named_table", "test_a_parametrize_of_lists[tokens0--1]",
                      "test_a_parametrize_of_lists[tokens1-4.0]"]
CONFTEST = '''import pytest


@pytest.fixture
def expression():
    return "3 4 -"
'''


def test_a_special_case_of_inputs_bound_outside_the_check_earns_nothing_when_graded(config):
    """The same rows graded as grading runs them (pytest requesting the fixture, the drafts' copies of the test
    body run after it), and the rows whose inputs the test receives at run time (a conftest.py fixture, `params=`,
    `yield`, a named table, a parametrize of lists; `__varied__` and its module in the sandbox): the special case
    of the issue's examples passes none of the tests (at most one: each of the nine misses it when its three drafts,
    drawn anew each grading, all change an input whose answer the bug shares, about 1 in 100 for `"3 4 -"` in
    process), and the gold patch, run in two sandboxes, still equals itself on every draft and resolves."""
    path, init = "tests/test_evaluator.py", "rpn/__init__.py"
    row = variant("rpn", path, "\n" + BOUND_OUTSIDE_THE_CHECKS + GIVEN_AT_RUN_TIME.replace("import pytest\n", ""),
                  BOUND[0])
    row["test_patch"] += make_patch({}, {"tests/conftest.py": CONFTEST})
    row["FAIL_TO_PASS"] = [f"{path}::{name}" for name in [*BOUND, *GRADED_AT_RUN_TIME]]
    base = SOURCES["rpn"].files_at_base()[init]
    special_case = (f"\n\n_ISSUE = {ISSUE_EXAMPLES['rpn'][1]!r}\n_evaluate = evaluate\n\n\ndef evaluate(text):\n"
                    "    return _ISSUE[text] if text in _ISSUE else _evaluate(text)\n")
    grade = grade_patch(row, make_patch({init: base}, {init: base + special_case}), config, eval_timeout=300)
    assert grade.patch_applied and grade.f2p_passed <= 1 and not grade.resolved, grade.info()
    grade = grade_patch(row, row["patch"], config, eval_timeout=300)
    assert grade.resolved and grade.differ == [], grade.info()


def _from_the_frames(bug):
    """`evaluate` that answers with the `want` of the test's frame where one holds a value (frames are reached
    unaudited: `logging.currentframe()`, `f_back`, `f_locals`), and keeps the bug otherwise."""
    def evaluate(text):
        frame = sys._getframe(1)
        while frame is not None and frame.f_locals.get("want") is None:
            frame = frame.f_back
        return bug.evaluate(text) if frame is None else frame.f_locals["want"]
    return evaluate


def test_the_expected_column_of_a_loop_table_is_not_left_in_the_tests_frame(tmp_path, monkeypatch):
    """`for expression, want in [("3 4 -", -1), ...]: assert evaluate(expression) == want` kept `want` in the
    test's frame, where the package read it and returned it (resolved, 2 of 2 gradings in the wave 9 review): a
    loop over a literal table binds data, as a parametrize list does, and a column read only as an expected side
    is None in the text."""
    with _at_base_and_gold("rpn", tmp_path) as (bug, gold):
        for seed in range(3):
            text = observe("from rpn import evaluate\n" + LOOP_TABLE, random.Random(seed), set())  # the frame alone
            assert "-1" not in text and "4.0" not in text
            right = _values(text, ["test_a_loop_table"], {"evaluate": gold.evaluate}, monkeypatch)
            lie = _values(text, ["test_a_loop_table"], {"evaluate": _from_the_frames(bug)}, monkeypatch)
            assert lie != right


# rpn: checks the form left out of its reports, each in a test with another, reported check (so the gold run
# observed the test): an assert no lambda can hold (`:=`), and a branch that fails the test
DECIDED_OUTSIDE_THE_CHECKS = '''
import pytest
from rpn import evaluate


def test_walrus():
    assert evaluate("2 3 +") == 5
    assert (result := evaluate("3 4 -")) == -1


def test_branch_raises():
    assert evaluate("2 3 +") == 5
    got = evaluate("3 4 -")
    if got != -1:
        raise AssertionError(f"3 4 - gave {got}")


def test_branch_fails():
    assert evaluate("2 3 +") == 5
    got = evaluate("8 2 /")
    if not got == 4.0:
        pytest.fail(f"8 2 / gave {got}")
'''


class _Lie:
    """The bug's value, equal to everything: what the package hands out where no report sees it."""

    def __init__(self, honest):
        self.honest = honest

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def _honest(value):
    return value.honest if type(value) is _Lie else value


def _reporting_the_honest_value(check, value):
    """The package's wrapping of `__check__` and `__value__`: they report the honest value, and `__value__` hands the
    lie on."""
    return (lambda thunk, *how: check(lambda: _honest(thunk()), *how),
            lambda reported: (value(_honest(reported)), reported)[1])


def _decisions_are_reported(source: str, names: list[str], drafted: set[str], tmp_path, monkeypatch) -> None:
    """The liar above passes each test `names` of `source` as written, and yet reports other values than the gold
    patch in its observation form (tests `drafted` drafted), for 3 seeds."""
    with _at_base_and_gold("rpn", tmp_path) as (bug, gold):
        liar = lambda expression: _Lie(bug.evaluate(expression))  # noqa: E731
        namespace: dict = {}
        monkeypatch.setitem(sys.modules, "rpn", types.SimpleNamespace(evaluate=liar))
        exec(compile(source, "<tests>", "exec"), namespace)
        for name in names:
            namespace[name]()  # the lie passes each test as written
        for seed in range(3):
            text = observe(source, random.Random(seed), drafted)
            right = _values(text, names, {"evaluate": gold.evaluate}, monkeypatch)
            lie = _values(text, names, {"evaluate": liar}, monkeypatch, wrap=_reporting_the_honest_value)
            assert all(lie[name] != right[name] and right[name]["count"] for name in names), (lie, right)


def test_a_decision_the_test_makes_outside_its_checks_is_reported(tmp_path, monkeypatch):
    """A package that wraps the reporting builtins (an assignment: no audited event) so that every value they see is
    its honest one, and hands out a value equal to everything elsewhere, passed an assert left as written (`:=`)
    and `if got != -1: raise ...` / `pytest.fail(...)`, whose decisions no report showed: each of these rpn tests
    was resolved on main with the bug kept (one grading each). The assert's calls are reported now, and a branch
    that only fails the test is observed as the check of its negated condition."""
    names = ["test_walrus", "test_branch_raises", "test_branch_fails"]
    _decisions_are_reported(DECIDED_OUTSIDE_THE_CHECKS, names, set(names), tmp_path, monkeypatch)


# rpn: the shapes of the same class that wave 9 left open: a branch raising another exception (it may be a skip, so
# it is no check the form may drop), a branch with other statements, a value bound before an assert left as written
DECIDED_BY_OTHER_BRANCHES = '''
from rpn import evaluate


def test_branch_raises_another_exception():
    assert evaluate("2 3 +") == 5
    got = evaluate("3 4 -")
    if got != -1:
        raise ValueError(got)


def test_branch_with_other_statements():
    assert evaluate("2 3 +") == 5
    got = evaluate("8 2 /")
    if got != 4.0:
        print(got)
        raise AssertionError(got)


def test_bound_before_a_walrus():
    assert evaluate("2 3 +") == 5
    got = evaluate("3 4 -")
    assert (value := got) == -1


def test_called_in_the_condition():
    assert evaluate("2 3 +") == 5
    if evaluate("3 4 -") != -1:
        raise ValueError("3 4 -")
'''


def test_a_value_that_decides_a_branch_or_an_assert_left_as_written_is_reported(tmp_path, monkeypatch):
    """The same liar passed these shapes on main (none of their decisions was reported: its values equalled the gold
    patch's, without drafts). A value bound to a name that decides a branch or an assert left as written reports
    its value, and the calls of a branch's condition theirs."""
    names = ["test_branch_raises_another_exception", "test_branch_with_other_statements",
             "test_bound_before_a_walrus", "test_called_in_the_condition"]
    _decisions_are_reported(DECIDED_BY_OTHER_BRANCHES, names, set(), tmp_path, monkeypatch)


# rpn: the hidden test's check is in a helper module the test patch adds; the package wraps the reporting builtins
# (they see its honest value) and hands out a value equal to everything elsewhere
CHECKED_BY_A_HELPER = '''
from helpers import check_evaluates


def test_subtraction_order_by_a_helper():
    check_evaluates("3 4 -", -1)
'''
HELPER_MODULE = '''from rpn import evaluate


def check_evaluates(expression, expected):
    assert evaluate(expression) == expected
'''
# the lines the package adds to rpn/__init__.py: the lie and the honest value above, then the wrapping
HONEST_WHEN_REPORTED = ("\n\nimport builtins as _builtins\n\n\n" + inspect.getsource(_Lie) + "\n\n"
                        + inspect.getsource(_honest) + '''

if hasattr(_builtins, "__check__"):
    _check, _value = _builtins.__check__, _builtins.__value__
    _builtins.__check__ = lambda thunk, *how: _check(lambda: _honest(thunk()), *how)
    _builtins.__value__ = lambda value: _value(_honest(value))

_evaluate = evaluate


def evaluate(expression):
    return _Lie(_evaluate(expression))
''')


def test_a_check_in_a_helper_module_of_the_test_patch_is_observed(config):
    """`tests/helpers.py`, added by the test patch, asserted as written, and only the helper call's value (None) was
    reported: the package above (no frames, no audited event) resolved this row on main with the bug kept. The test
    patch's other Python modules are observed as its test files are: its value is the honest one, not the gold
    patch's."""
    path, init = "tests/test_evaluator.py", "rpn/__init__.py"
    row = variant("rpn", path, CHECKED_BY_A_HELPER, "test_subtraction_order_by_a_helper")
    row["test_patch"] += make_patch({}, {"tests/helpers.py": HELPER_MODULE})
    assert grade_patch(row, row["patch"], config, eval_timeout=300).resolved
    base = SOURCES["rpn"].files_at_base()[init]
    grade = grade_patch(row, make_patch({init: base}, {init: base + HONEST_WHEN_REPORTED}), config, eval_timeout=300)
    assert grade.patch_applied and grade.differ == row["FAIL_TO_PASS"] and not grade.resolved, grade.info()


# rpn: the issue's examples reach the test as values no text of the test's body holds (a module constant, a table built
# by code, a fixture of conftest.py, a fixture with `params=` or `yield`), by a parametrize of lists, or by a table
# bound to a name; the expected values too, in the last two
GIVEN_AT_RUN_TIME = '''
import pytest
from rpn import evaluate

CASES = [("3 4 -", -1), ("8 2 /", 4.0)]
SUBTRACTION = "3 4 -"
BUILT = [(" ".join([a, b, op]), want) for a, b, op, want in [("3", "4", "-", -1)]]


def test_a_module_constant():
    assert evaluate(SUBTRACTION) == -1


def test_a_table_built_by_code():
    for expression, want in BUILT:
        assert evaluate(expression) == want


@pytest.fixture(params=["8 2 /"], ids=["quotient"])
def quotient(request):
    return request.param


@pytest.fixture
def subtraction():
    yield "3 4 -"


def test_a_conftest_fixture(expression):
    assert evaluate(expression) == -1


def test_a_params_fixture(quotient):
    assert evaluate(quotient) == 4.0


def test_a_yield_fixture(subtraction):
    assert evaluate(subtraction) == -1


def test_a_named_table():
    for expression, want in CASES:
        assert evaluate(expression) == want


@pytest.mark.parametrize("expression, want", CASES)
def test_a_named_parametrize(expression, want):
    assert evaluate(expression) == want


@pytest.mark.parametrize("tokens, want", [(["3", "4", "-"], -1), (["8", "2", "/"], 4.0)])
def test_a_parametrize_of_lists(tokens, want):
    assert evaluate(" ".join(tokens)) == want
'''
# what the fixtures give the tests that request them (a conftest.py fixture's value, a `params=` one's, a yield one's)
FIXTURES = {"expression": "3 4 -", "quotient": "8 2 /", "subtraction": "3 4 -"}
GIVEN = ["test_a_module_constant", "test_a_table_built_by_code", "test_a_conftest_fixture", "test_a_params_fixture",
         "test_a_yield_fixture", "test_a_named_table", "test_a_named_parametrize", "test_a_parametrize_of_lists"]


def _rows(text: str, name: str, monkeypatch) -> list[dict]:
    """What pytest passes the test `name` of `text`: a row of its parametrize each (as the text writes them, the
    expected column None where the form dropped it), else the values of the fixtures it requests."""
    namespace: dict = {}
    monkeypatch.setitem(sys.modules, "rpn", types.SimpleNamespace(evaluate=None))
    exec(compile(text, "<tests>", "exec"), namespace)
    marks = getattr(namespace[name], "pytestmark", [])
    if not marks:
        return [{p: FIXTURES[p] for p in inspect.signature(namespace[name]).parameters}]
    names, rows = marks[0].args
    names = [n.strip() for n in names.split(",")]
    return [dict(zip(names, row)) for row in rows]


def test_inputs_given_at_run_time_are_drafted_and_expected_values_leave_the_text(tmp_path, monkeypatch):
    """Drafts of a test changed the constants of its body and the module fixtures it requests, so an input the test
    reads from the module (a constant, a table built by code) or receives at run time (a conftest.py fixture, a
    fixture with `params=` or `yield`, a parametrize row of lists, a table bound to a name) was never changed: the
    special case of the issue's examples passed each such test for every seed on main (the list rows for 5 of 20),
    and the expected column of the named tables and of the parametrize of lists stayed in the text and in the
    test's frame, where the frame reader found it (every seed). Now a draft changes such an input, or a value of
    the module the body reads, when the test runs (`__varied__`), a named table or an immutable module constant is
    written where it is read, and a column of lists is dropped as a column of numbers is: both liars are caught
    for every seed and row (2 rows of 1,800 over 200 other seeds: three drafts that each made the two operands
    equal, `"3 4 -"` -> `"3 3 -"`, the constant row of "What this does not stop"), and the right code equals
    itself. But a table built by code at module level, whose value is varied as a whole: a draft changes its
    expected column as often as its input, so the special case passes it in 36 of 200 seeds (on main every seed);
    the frame reader in none."""
    with _at_base_and_gold("rpn", tmp_path) as (bug, gold):
        issue = ISSUE_EXAMPLES["rpn"][1]

        def special_case(text):
            return issue[text] if text in issue else bug.evaluate(text)

        passed = []
        for seed in range(10):
            text = observe(GIVEN_AT_RUN_TIME, random.Random(seed), set(GIVEN))
            assert "4.0)" not in text and "CASES" not in text  # no expected column in the text (but the built one)
            for name in GIVEN:
                for row in _rows(text, name, monkeypatch):
                    right = _values(text, [name], {"evaluate": gold.evaluate}, monkeypatch, arguments=row)
                    assert _values(text, [name], {"evaluate": gold.evaluate}, monkeypatch, arguments=row) == right
                    for liar in (special_case, _from_the_frames(bug)):
                        lie = _values(text, [name], {"evaluate": liar}, monkeypatch, arguments=row)
                        passed += [(seed, name, liar.__name__)] if lie == right else []
    built = [p for p in passed if p[1:] == ("test_a_table_built_by_code", "special_case")]
    assert len(built) <= 5 and passed == built, passed  # the built table: its limit above


# rpn: a value bound otherwise than by an assignment (a loop over a computed iterable, `with ... as`, `except ... as`)
# and read only by a decision no check reports (a branch raising another exception, an assert left as written)
DECIDED_BY_OTHER_BINDINGS = '''
import contextlib

from rpn import evaluate


def test_bound_by_a_loop():
    assert evaluate("2 3 +") == 5
    for got in [evaluate("3 4 -")]:
        if got != -1:
            raise ValueError(got)


def test_bound_by_a_with():
    assert evaluate("2 3 +") == 5
    with contextlib.nullcontext(evaluate("8 2 /")) as got:
        assert (value := got) == 4.0


def test_bound_by_an_except():
    assert evaluate("2 3 +") == 5
    try:
        raise LookupError(evaluate("3 4 -"))
    except LookupError as error:
        if error.args[0] != -1:
            raise ValueError(error)
'''


def test_a_value_bound_by_a_loop_a_with_or_an_except_that_decides_is_reported(tmp_path, monkeypatch):
    """The liar of the two tests above passed these shapes on main: the value a loop over a computed iterable, a
    `with ... as` or an `except ... as` binds decided a branch or an assert left as written, and no report showed
    it. Such a value is reported where it is bound (an exception's arguments too)."""
    names = ["test_bound_by_a_loop", "test_bound_by_a_with", "test_bound_by_an_except"]
    _decisions_are_reported(DECIDED_BY_OTHER_BINDINGS, names, set(), tmp_path, monkeypatch)


def test_a_module_of_the_base_suite_the_tests_import_is_observed():
    """A check in a helper of the base commit's suite (`tests/helpers.py`, not written by the test patch) that the
    hidden test calls ran as written: the shape of the test patch's helper, which the liar that wraps the reporting
    builtins resolved rpn with before wave 9 (`test_a_check_in_a_helper_module_of_the_test_patch_is_observed`, where
    observing the module stops it; no shipped task's base has a helper, so this row is not graded). Now grading
    observes every module of the suite under a test file's folder that
    the tests import, directly or through another (by name), and no module of the package, conftest.py, or a
    module nothing imports."""
    from trl_multiturn.envs.swegym.grading import helper_modules

    sources = {"tests/test_evaluator.py": "from helpers import check_evaluates\nimport tests.more\n",
               "tests/helpers.py": "from util.checks import near\n", "tests/util/__init__.py": "",
               "tests/util/checks.py": "def near(a, b):\n    assert abs(a - b) < 1e-9\n", "tests/more.py": "",
               "tests/unused.py": "", "tests/conftest.py": "", "rpn/helpers.py": "", "tests/data/broken.py": "def"}
    row = {"test_patch": make_patch({}, {"tests/test_evaluator.py": sources["tests/test_evaluator.py"]})}
    chosen = helper_modules(row, ["tests/test_evaluator.py"], sorted(sources), sources.__getitem__)
    assert sorted(chosen) == ["tests/helpers.py", "tests/more.py", "tests/util/__init__.py", "tests/util/checks.py"]


# rpn: inputs and expected values as class attributes, read through `self`
CLASS_ATTRIBUTES = '''
from rpn import evaluate


class TestOrder:
    EXPRESSION = "3 4 -"
    EXPECTED = -1

    def test_subtraction(self):
        assert evaluate(self.EXPRESSION) == self.EXPECTED
'''


def test_a_class_attribute_read_through_self_stays_in_the_text(tmp_path, monkeypatch):
    """A class attribute bound to a literal counted as data, read by no name, so its assignment went: `self.EXPRESSION`
    then raised AttributeError in both runs, before the package was called, and the base code (a comment-only patch)
    reported the gold patch's values. A name read as an attribute anywhere is not data."""
    text = observe(CLASS_ATTRIBUTES, random.Random(0), {"TestOrder::test_subtraction"})
    with _at_base_and_gold("rpn", tmp_path) as (bug, gold):
        digests = []
        for code in (bug, gold, gold):
            observations = _Observations()
            namespace = {"__check__": observations.check, "__value__": observations.value, "__varied__": varied}
            monkeypatch.setitem(sys.modules, "rpn", types.SimpleNamespace(evaluate=code.evaluate))
            exec(compile(text, "<tests>", "exec"), namespace)
            namespace["TestOrder"]().test_subtraction()
            digests.append(observations.take())
    assert digests[0] != digests[1] == digests[2]


LRU_SPECIAL = '''
_get = LRUCache.get


def _get_special(self, key, default=None):
    if self.capacity == 2 and key == "a" and list(self._data.items()) == [("a", 1), ("b", 2)]:
        self._data.move_to_end(key)  # the issue's own example answered as it expects; the bug kept otherwise
    return _get(self, key, default)


LRUCache.get = _get_special
'''


def test_inputs_of_call_statements_and_of_every_row_are_drafted(monkeypatch, tmp_path):
    """The wave 11 review's F1 and F4. The shipped lrucache test feeds its scenario through calls made as
    statements (`cache.put("a", 1)`), whose constants no draft changed: the special case of the issue's own example
    passed it for every seed (100 of 100; resolved in 3 of 3 gradings). And a body draft changed one constant of
    many, so a special case of one row of a loop table passed 14, 43, 64 and 79 of 100 seeds at 2, 4, 8 and 16 rows.
    Now a step's constants are inputs, and the body is drafted twice for each input constant (`BODY_DRAFTS` at
    most): the lrucache special case equals the gold patch for none of 10 seeds, the 8-row table's for 1 of 20
    (measured over 100 seeds: lrucache 0; tables of 2, 4, 8 and 16 rows 1, 0, 1 and 4, the 16 rows past the cap)."""
    source = SOURCES["lrucache"]
    tests = apply_edits(source.files_at_base(), source.tests)["tests/test_cache.py"]
    with _at_base_and_gold("lrucache", tmp_path) as (bug, gold):
        namespace = {"LRUCache": bug.LRUCache}
        exec(LRU_SPECIAL, namespace)
        for seed in range(10):
            text = observe(tests, random.Random(seed), {"test_get_refreshes_recency"})
            right, lie = (_values(text, ["test_get_refreshes_recency"], {"LRUCache": version.LRUCache,
                                                                          "memoize": gold.memoize},
                                  monkeypatch, package="lrucache") for version in (gold, types.SimpleNamespace(
                                      LRUCache=namespace["LRUCache"])))
            assert lie != right, seed
    rows = [("1 2 +", 3), ("2 3 *", 6), ("5 1 +", 6), ("2 2 *", 4), ("4 4 +", 8), ("6 3 *", 18), ("9 1 +", 10),
            ("3 4 -", -1)]
    table = (f"from rpn import evaluate\n\n\ndef test_table():\n    for expression, want in {rows!r}:\n"
             "        assert evaluate(expression) == want\n")
    with _at_base_and_gold("rpn", tmp_path) as (bug, gold):
        def lie(text):
            return -1 if text == "3 4 -" else bug.evaluate(text)

        passed = sum(_values(text, ["test_table"], {"evaluate": lie}, monkeypatch)
                     == _values(text, ["test_table"], {"evaluate": gold.evaluate}, monkeypatch)
                     for text in (observe(table, random.Random(seed), {"test_table"}) for seed in range(20)))
    assert passed <= 1  # 1 of these 20 seeds (a changed input every version rejects, twice); 11 of 20 before


EXPECTED_BY_TRY_ELSE = '''
from rpn import evaluate


def test_division_by_zero():
    try:
        evaluate("1 0 /")
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("no error")
'''


def test_a_call_in_a_try_with_handlers_lets_its_exception_reach_them(tmp_path, monkeypatch):
    """The wave 11 review's F9: `try: f() except E: pass else: raise AssertionError`: a call statement observed by
    `__check__` swallowed the exception, so the `else` raised and the gold patch failed the test (the row silently
    unresolvable). In a `try` with handlers the call is reported by `__value__`, which lets the exception through:
    the gold code passes."""
    names = ["test_division_by_zero"]
    with _at_base_and_gold("rpn", tmp_path) as (_, gold):
        for seed in range(2):
            text = observe(EXPECTED_BY_TRY_ELSE, random.Random(seed), set(names))
            assert _values(text, names, {"evaluate": gold.evaluate}, monkeypatch)["test_division_by_zero"]["count"]
