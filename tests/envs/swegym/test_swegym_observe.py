"""The observation form (trl_multiturn/envs/swegym/observe.py) and the values the runner reports from it
(pytest_runner._Observations): run in-process here on a small module, the way grading runs it in two sandboxes,
once with the right code (the gold run) and once with each liar. A liar passes every original assert of its test
and yet reports other values than the right code, so the host's comparison fails it; and the text the patch's run
sees holds no expected value. Grading with it in sandboxes: test_swegym_attacks.py and test_swegym.py."""

import contextlib
import random

import pytest

from trl_multiturn.envs.swegym.integrity import judge_values
from trl_multiturn.envs.swegym.observe import function_name, is_data, observe
from trl_multiturn.envs.swegym.pytest_runner import _Observations, _plain
from trl_multiturn.envs.swegym.tasks import task_sources
from trl_multiturn.envs.swegym.tasks.source import apply_edits
from trl_multiturn.envs.swegym.variation import varied

RIGHT = '''
class Version:
    def __init__(self, *parts):
        self.parts = parts

    def __eq__(self, other):
        return isinstance(other, Version) and self.parts == other.parts

    def __lt__(self, other):
        return self.parts < other.parts


def double(x):
    return 2 * x


def is_even(x):
    return x % 2 == 0


def find(items, x):
    return items.index(x) if x in items else None


def encode(n):
    return "<" + str(n * 7) + ">"


def decode(text):
    return int(text[1:-1]) // 7


def check(x):
    if x < 0:
        raise ValueError(x)
    return x
'''

TESTS = '''
import unittest

import pytest


def test_equal():
    """double(21) is 42"""
    assert double(21) == 42, "42 expected"


def test_bound():
    assert double(-3) < -5


def test_not_equal():
    assert double(5) != 11


def test_not_in():
    assert double(5) not in (9, 11)


def test_bare_truth():
    assert is_even(14)


def test_is_none():
    assert find([1, 2], 3) is None


def test_order():
    assert Version(1, 2) < Version(1, 10)
    assert Version(2, 0) > Version(1, 10)


def test_round_trip():
    values = [3, 14, 159]
    assert [decode(encode(v)) for v in values] == values


def test_raises():
    with pytest.raises(ValueError):
        check(-1)


def test_nothing_raises():
    check(5)


EXPECTED = 42


def test_named_values():
    expected = [3, 14, 159]
    assert double(21) == EXPECTED
    assert [decode(encode(v)) for v in [3, 14, 159]] == expected


class TestStyle(unittest.TestCase):
    def test_helpers(self):
        self.assertEqual(double(21), 42)
        self.assertTrue(is_even(14))
'''
NAMES = ["test_equal", "test_bound", "test_not_equal", "test_not_in", "test_bare_truth", "test_is_none",
         "test_order", "test_round_trip", "test_raises", "test_nothing_raises", "test_named_values",
         "TestStyle::test_helpers"]

# Each liar passes every original assert of its tests (checked below) without computing the right answer.
ALWAYS = '''
class _Liar:
    def __init__(self, value):
        self._value = value
    __eq__ = __ne__ = __lt__ = __le__ = __bool__ = lambda self, *other: True
    __gt__ = __ge__ = lambda self, other: False
    __hash__ = object.__hash__
'''
LIARS = {
    # equal to anything: ==, and a hedge equal to each of a few plausible answers
    "always-equal": ("test_equal", ALWAYS + "double = lambda x: _Liar(x)\n"),
    "hedge": ("test_equal", "class _Hedge(int):\n    __eq__ = lambda self, other: other in (40, 41, 42, 43, 44)\n"
                            "    __hash__ = int.__hash__\ndouble = lambda x: _Hedge(x)\n"),
    # below everything, against a literal bound
    "below-everything": ("test_bound", "class _Low:\n    __lt__ = __le__ = lambda s, o: True\n"
                                       "    __gt__ = __ge__ = lambda s, o: False\ndouble = lambda x: _Low()\n"),
    # operators a liar flips without a written expected value: !=, not in, bare truth, is None
    "not-equal-to-anything": ("test_not_equal", ALWAYS.replace("__eq__ = __ne__", "__ne__") +
                              "    __eq__ = lambda self, other: False\ndouble = lambda x: _Liar(x)\n"),
    "in-nothing": ("test_not_in", ALWAYS.replace("__eq__ = __ne__", "__ne__") +
                   "    __eq__ = lambda self, other: False\ndouble = lambda x: _Liar(x)\n"),
    "always-true": ("test_bare_truth", "is_even = lambda x: True\n"),
    "always-none": ("test_is_none", "find = lambda items, x: None\n"),
    # a comparison that answers by its operator: < and > are both true
    "order-by-operator": ("test_order", "Version.__lt__ = Version.__gt__ = lambda self, other: True\n"),
    # the encoder tags its output with the input, the decoder returns the tag (a round-trip liar)
    "tagged-round-trip": ("test_round_trip",
                          "class _Tagged(str):\n    pass\n\n\ndef encode(n):\n    text = _Tagged('<?>')\n"
                          "    text.source = n\n    return text\n\n\ndecode = lambda text: text.source\n"),
    "invisible-tag-round-trip": ("test_round_trip", "encode = lambda n: '<0>' + '\\u200b' * n\n"
                                                    "decode = lambda text: text.count('\\u200b')\n"),
    # raises whatever it is given
    "always-raises": ("test_raises", "def check(x):\n    raise ValueError(x)\n"),
    # a test that only checks that nothing raises, and unittest's assertion helpers
    "never-raises": ("test_nothing_raises", "check = lambda x: None\n"),
    "unittest-always-equal": ("TestStyle::test_helpers", ALWAYS + "double = lambda x: _Liar(x)\n"),
    # the expected value named (a module constant, a local), not written in the check
    "named-always-equal": ("test_named_values", ALWAYS + "double = lambda x: _Liar(x)\n"),
}


def _run(text: str, implementation: str, names: list[str] = NAMES) -> dict[str, dict]:
    """The tests `names` of `text` run against `implementation`: {name: the runner's record (count, digest)}."""
    observations = _Observations()
    namespace = {"__check__": observations.check, "__value__": observations.value,
                 "__raised__": observations.raised, "__varied__": varied}
    exec(compile(implementation, "<package>", "exec"), namespace)
    exec(compile(text, "<tests>", "exec"), namespace)
    out = {}
    for name in names:
        observations.take()
        _test(namespace, name)()
        out[name] = observations.take()
    return out


def _test(namespace: dict, name: str):
    """The test function `f` or the bound method `Class::f` of an instance."""
    if "::" in name:
        cls, method = name.split("::")
        return getattr(namespace[cls](), method)
    return namespace[name]


def _original_asserts_pass(implementation: str, name: str) -> bool:
    namespace: dict = {}
    exec(compile(implementation, "<package>", "exec"), namespace)
    exec(compile(TESTS, "<tests>", "exec"), namespace)
    _test(namespace, name)()
    return True


# A constant that is the right answer for the test's own inputs is told apart only by drafts (FAIL_TO_PASS tests).
CONSTANT = {"always-true", "always-none", "always-raises"}


@pytest.mark.parametrize("liar", sorted(set(LIARS) - CONSTANT))
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("drafted", [False, True], ids=["p2p", "f2p"])
def test_a_liar_that_passes_the_asserts_reports_other_values_than_the_right_code(liar, seed, drafted):
    name, lie = LIARS[liar]
    lying = RIGHT + "\n" + lie
    assert _original_asserts_pass(lying, name)  # the lie works on the test as written
    text = observe(TESTS, random.Random(seed), set(NAMES) if drafted else set())
    gold, patch = _run(text, RIGHT), _run(text, lying)
    assert patch[name] != gold[name] and patch[name]["count"] > 0
    assert _run(text, RIGHT) == gold  # the right code reports the same values every time


@pytest.mark.parametrize("liar", sorted(CONSTANT))
def test_a_constant_right_for_the_tests_inputs_is_caught_by_drafts(liar):
    """A constant (None, True, an exception) that is the right answer for the test's own inputs reports the right
    values for them; only a draft whose right answer differs tells it apart, so it is caught in most gradings, not
    all (PASS_TO_PASS tests have no drafts: the base code passes them, so a lie there earns nothing)."""
    name, lie = LIARS[liar]
    caught = 0
    for seed in range(20):
        text = observe(TESTS, random.Random(seed), set(NAMES))
        caught += _run(text, RIGHT, [name]) != _run(text, RIGHT + "\n" + lie, [name])
    assert caught >= 12, caught  # measured: always-none 13, always-true 17, always-raises 18 of 20


@pytest.mark.parametrize("seed", range(3))
def test_the_observed_text_holds_no_expected_value_operator_or_message(seed):
    text = observe(TESTS, random.Random(seed), set(NAMES))
    for gone in ("== 42", "42 expected", "double(21) is 42", "< -5", "!= 11", "(9, 11)", "is None", "== values",
                 "assert", "pytest.raises", "Version(1, 10) >", "EXPECTED", "expected =", "== expected"):
        assert gone not in text, (gone, text)
    assert text.count("__check__(lambda: double(") >= 3 * 4  # each check of a drafted test: itself and two drafts


def test_what_each_kind_of_check_reports():
    text = observe(TESTS, random.Random(0), set())
    assert "__check__(lambda: double(21), 'compared')" in text  # the data side dropped
    assert "__check__(lambda: double(-3), 'compared')" in text  # a literal bound dropped, and the operator with it
    assert "__check__(lambda: double(5), 'compared')" in text  # `!=` and `not in` alike: no operator is said
    assert "__check__(lambda: is_even(14), 'truth')" in text  # a bare truth: the value and what `bool` says
    assert "__check__(lambda: find([1, 2], 3))" in text  # an identity: the value alone
    # an ordering: the comparison both ways
    assert "__check__(lambda: __value__(Version(1, 2)) < __value__(Version(1, 10)))" in text
    assert "__check__(lambda: __value__(Version(1, 10)) < __value__(Version(1, 2)))" in text
    # an inner call reports its value too
    assert "__check__(lambda: [__value__(decode(__value__(encode(v)))) for v in values], 'compared')" in text
    assert "__raised__(__grading_error__, False)" in text and "__raised__(None)" in text
    assert "__check__(lambda: check(5))" in text  # a call made as a statement
    assert "assertEqual" not in text and "assertTrue" not in text


def test_plain_values_are_json_data_that_equal_answers_share():
    assert _plain(4.0) == _plain(4) == 4 and _plain(0.1 + 0.2) == _plain(0.3)
    assert _plain((1, [2])) == {"tuple": [1, [2]]} and _plain({3, 1}) == {"set": [1, 3]}
    assert _plain({"b": 1, "a": 2}) == _plain({"a": 2, "b": 1})
    assert _plain(ValueError("x")) == {"raised": "ValueError"}
    cycle: list = []
    cycle.append(cycle)
    assert _plain(cycle) == [{"cut": "list"}]


def test_data_is_what_a_test_writes_as_an_expected_value():
    import ast

    for text in ("4", "[Interval(1, 5)]", "(10, 0)", "None", "{'a': 1}", "-1", "pytest.approx(0.3)"):
        assert is_data(ast.parse(text, mode="eval").body), text
    for text in ("f(1)", "rows", "parse('1.0')", "a.balance", "[f(1)]"):
        assert not is_data(ast.parse(text, mode="eval").body), text


@pytest.mark.parametrize("source", task_sources(), ids=lambda s: s.name)
def test_every_shipped_test_file_has_an_observation_form_without_asserts(source):
    """Every check of the shipped tasks' tests is rewritten (none is left with its expected side)."""
    import json
    from pathlib import Path

    task = json.loads((Path(source.root) / "task.json").read_text()) if hasattr(source, "root") else None
    files = apply_edits(source.files_at_base(), [])
    tests = {p: t for p, t in files.items() if p.startswith("tests/")}
    assert tests
    for path, text in tests.items():
        observed = observe(text, random.Random(0), {function_name(f"{path}::test_x")})
        assert "assert " not in observed and "__check__" in observed, (path, task)


PARAMETRIZED = '''
import pytest


@pytest.mark.parametrize("text, expected", [("3 4 -", -1), ("8 2 /", 4.5), ("\\u00e9", True), ("\\u00e9", True)])
def test_evaluate(text, expected):
    assert evaluate(text) == expected


@pytest.mark.parametrize("n", [1, 2])
def test_identity(n):
    assert f(n) == n


CASES = [(["3", "4", "-"], -1), (["8", "2", "/"], None), ([], {"empty": (1, -2.5)})]


@pytest.mark.parametrize("tokens, expected", CASES)
def test_named(tokens, expected):
    assert evaluate(" ".join(tokens)) == expected


@pytest.mark.parametrize("tokens, expected", [(["1"], [1]), (["2"], [2])], ids=["one", "two"])
def test_given_ids(tokens, expected):
    assert evaluate(" ".join(tokens)) == expected
'''


def test_a_parametrize_column_used_only_as_expected_values_goes_and_the_test_ids_stay(tmp_path):
    text = observe(PARAMETRIZED, random.Random(0), {"test_evaluate"})
    assert "-1)" not in text and "4.5)" not in text and "True)" not in text  # the expected column is None now
    assert "CASES" not in text and "empty" not in text and "[1]" not in text  # lists, a named table: None too
    assert "__check__(lambda: evaluate(text), 'compared')" in text and "== expected" not in text
    assert "[1, 2]" in text  # a column the test still reads as an input stays
    ids = {}
    for name, source in (("original", PARAMETRIZED), ("observed", text)):
        (tmp_path / f"test_{name}.py").write_text(source)
        result = pytest.main(["-q", "--collect-only", "-p", "no:cacheprovider", str(tmp_path / f"test_{name}.py")],
                             plugins=[collected := _Collected()])
        assert result == 0
        ids[name] = collected.ids
    assert ids["observed"] == ids["original"] and len(ids["original"]) == 11


class _Collected:
    def __init__(self):
        self.ids: list[str] = []

    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid.split("::", 1)[1] for item in session.items]


def test_an_object_the_test_works_on_or_a_list_it_fills_is_not_an_expected_value():
    """`cache = LRUCache(2)` and `calls = []` filled by `calls.append` are inputs, not expected values: a check
    against them reports the membership and the list (for `"b" not in cache`, the membership, not `"b"` alone)."""
    source = ("def test_cache():\n    cache = LRUCache(2)\n    calls = []\n    calls.append(1)\n"
              "    assert 'b' not in cache\n    assert calls == [1]\n")
    text = observe(source, random.Random(0), set())
    assert "__check__(lambda: 'b' in cache)" in text and "__check__(lambda: calls, 'compared')" in text
    assert "cache = LRUCache(2)" in text and "calls = []" in text


# Issue 60, "value checks that still flip": the operator that decides is the package's. `Amount` is the package's
# class; the base code's bugs are in its operators only, so an amount's state is the gold patch's in both.
AMOUNT = '''
import warnings


class Amount:
    def __init__(self, cents):
        self.cents = cents

    def __eq__(self, other):
        if isinstance(other, (int, float)):
            return self.cents == {scale}
        return isinstance(other, Amount) and self.cents == other.cents
{ne}
    def __bool__(self):
        return self.cents {truth} 0

    __hash__ = None


def parse(text):
    return Amount(round(float(text) * 100))


def old(x):
{warn}    return x
'''
BASE = AMOUNT.format(scale="other", ne="\n    def __ne__(self, other):\n        return False\n", truth=">",
                     warn="")
GOLD = AMOUNT.format(scale="round(other * 100)", ne="", truth="!=",
                     warn="    warnings.warn('old() is deprecated', DeprecationWarning)\n")
OPERATOR_TESTS = '''
import pytest


def test_equal_to_a_written_number():
    assert parse("1.50") == 1.5


def test_bare_truth():
    assert parse("-0.01")


def test_not_equal_to_a_constructed_amount():
    assert parse("1.50") != Amount(151)


def test_not_equal_to_another_amount():
    assert parse("1.50") != parse("1.51")


def test_deprecated():
    with pytest.warns(DeprecationWarning, match="deprecated"):
        old(1)
'''


def _run_package(tmp_path, implementation: str, text: str, names: list[str]) -> dict[str, dict]:
    """`_run` with the package's code in a file of the repository (`tmp_path`), where the runner finds the package's
    operators, `pytest.warns` replaced by a block that passes whatever (as a patch can from inside the test
    process), and `__warned__` installed as the runner installs it."""
    observations = _Observations(root=str(tmp_path))
    path = tmp_path / "pkg.py"
    path.write_text(implementation)
    namespace = {"__check__": observations.check, "__value__": observations.value,
                 "__raised__": observations.raised, "__warned__": observations.warned}
    exec(compile(implementation, str(path), "exec"), namespace)
    exec(compile(text, "<tests>", "exec"), namespace)
    out = {}
    for name in names:
        observations.take()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pytest, "warns", lambda *args, **kwargs: contextlib.nullcontext())
            _test(namespace, name)()
        out[name] = observations.take()
    return out


@pytest.mark.parametrize("name", ["test_equal_to_a_written_number", "test_bare_truth",
                                  "test_not_equal_to_a_constructed_amount", "test_not_equal_to_another_amount",
                                  "test_deprecated"])
def test_a_check_the_packages_operator_decides_is_not_passed_by_the_base_code(name, tmp_path):
    """The base code, whose bug is in `Amount.__eq__`, `__ne__`, `__bool__` or a missing warning, reported the
    gold patch's values (the state of an amount, the value `old` returns): the comparison, the truth and the warning
    were never reported, so an unfixed patch resolved. Now a bare truth reports what `bool` answers, `!=` against
    an object the test constructs or another computed one reports the comparison, a `pytest.warns` block the
    warnings given, and `==`
    against a written number (the number gone from the text) is blind where the package's `__eq__` would decide:
    the gold run's record says so and the host fails the test whatever the patch's run reports."""
    text = observe(OPERATOR_TESTS, random.Random(0), {name})
    assert "1.5)" not in text and "pytest.warns" not in text and "DeprecationWarning" not in text
    gold = _run_package(tmp_path, GOLD, text, [name])[name]
    assert _original_passes(GOLD, name) and not _original_passes(BASE, name)
    base = _run_package(tmp_path, BASE, text, [name])[name]
    outcome = judge_values({name: "PASSED"}, {name: base}, {name: "PASSED"}, {name: gold}, [name])[name]
    assert outcome == "FAILED"
    assert (gold["blind"] > 0) == (name == "test_equal_to_a_written_number")
    if name != "test_equal_to_a_written_number":  # observed: the gold patch's values are its own again
        assert _run_package(tmp_path, GOLD, text, [name])[name] == gold and base != gold


def _original_passes(implementation: str, name: str) -> bool:
    namespace: dict = {}
    exec(compile(implementation, "<package>", "exec"), namespace)
    exec(compile(OPERATOR_TESTS, "<tests>", "exec"), namespace)
    try:
        namespace[name]()
    except (AssertionError, pytest.fail.Exception):
        return False
    return True


def test_a_dataclass_or_a_value_without_the_packages_operators_is_not_blind(tmp_path):
    """Blindness is for operators of the repository's own code: a dataclass's generated `__eq__` compares the state
    that is reported, and numbers, strings and containers are the builtins'."""
    package = "import dataclasses\n\n\n@dataclasses.dataclass\nclass Point:\n    x: int\n\n\ndef make(x):\n" \
              "    return Point(x)\n"
    text = observe("def test_point():\n    assert make(1) == Point(1)\n    assert make(1).x == 1\n"
                   "    assert [make(1).x] == [1]\n", random.Random(0), set())
    assert _run_package(tmp_path, package, text, ["test_point"])["test_point"]["blind"] == 0


def test_a_value_is_reported_whole_however_long_or_deep_it_is():
    """`_plain` kept the first 10,000 items and 12 levels, so code whose value differed past them reported the gold
    patch's; every item is written now, and a value deeper than the runner can write is a blind check (failed)."""
    def record(value):
        observations = _Observations()
        observations.check(lambda: value)
        return observations.take()

    def nested(levels: int, bottom):
        value = bottom
        for _ in range(levels):
            value = [value]
        return value

    assert record(list(range(10_001))) != record([*range(10_000), -1])
    assert record(nested(20, [1])) != record(nested(20, [2])) and record(nested(20, [1]))["blind"] == 0
    assert record(nested(10_000, 1))["blind"] == 1


def test_a_passing_to_passing_test_without_observed_values_is_not_passed_on_the_patchs_word():
    """A PASS_TO_PASS test whose gold run reported no value passed on the outcome the patch's run reported, so a
    patch that broke what it checks and faked its pass inside the test process kept its reward: failed now, as a
    FAIL_TO_PASS one is (both are in `tests`; the judge does not tell them apart)."""
    test = "tests/test_x.py::test_unobservable"
    gold = {test: {"count": 0, "digest": "e3b0", "blind": 0}}
    assert judge_values({test: "PASSED"}, dict(gold), {test: "PASSED"}, gold, [test]) == {test: "FAILED"}
