"""Mutation twins (trl_multiturn/envs/swegym/twins.py): a test expecting a wrong value, which a right answer fails
and an answer that merely claims to be right passes. The pure mutation here; grading with twins in sandboxes:
test_swegym_attacks.py (the attacks they stop) and test_swegym.py (gold still resolves)."""

import ast
import random

import pytest

from trl_multiturn.envs.swegym.integrity import judge_twins
from trl_multiturn.envs.swegym.pytest_runner import _absent, _other
from trl_multiturn.envs.swegym.tasks import task_sources
from trl_multiturn.envs.swegym.tasks.source import apply_edits
from trl_multiturn.envs.swegym.twins import function_name, make_twins

IMPLEMENTATION = '''
import pytest


class Version:
    def __init__(self, *parts):
        self.parts = parts

    def __eq__(self, other):
        return isinstance(other, Version) and self.parts == other.parts

    def __lt__(self, other):
        return self.parts < other.parts


def double(x):
    return 2 * x


def name(s):
    return s.upper()


def pair(x):
    return [x, x]


def table():
    return {"a": 1, "b": (2.5, "c")}


def check(x):
    if x < 0:
        raise ValueError(x)
    return x
'''

TESTS = '''
# a comment outside the tests: it stays in both texts


def test_int():
    assert double(2) == 4


def test_str_left():
    assert "AB" == name("ab")


def test_list():
    assert pair(3) == [3, 3]


def test_dict():
    assert table() == {"a": 1, "b": (2.5, "c")}


def test_call_of_a_class():
    assert Version(1, 2) == Version(1, 2)


def test_order_and_membership():
    assert Version(1) < Version(2) and 3 in pair(3) and 4 not in pair(3)


def test_names_only():
    x = 5
    assert double(x) == x + x


def test_bare_and_negated():
    assert isinstance(double(1), int)
    assert not double(0)


def test_or():
    assert double(1) == 2 or double(1) == 3


def test_all():
    assert all(double(n) == n * 2 for n in range(5))


def test_raises_only():
    with pytest.raises(ValueError):
        check(-1)


def test_raises_then_assert():
    with pytest.raises(ValueError):
        check(-1)
    assert check(3) == 3


class TestGroup:
    def test_method(self):
        assert double(5) == 10


def test_nothing_to_check():
    double(1)
'''

NAMES = [function_name(f"t.py::{n}") for n in [
    "test_int", "test_str_left", "test_list", "test_dict", "test_call_of_a_class", "test_order_and_membership",
    "test_names_only", "test_bare_and_negated", "test_or", "test_all", "test_raises_only", "test_raises_then_assert",
    "TestGroup::test_method[x]"]]


def _outcomes(source: str, liar: bool = False) -> dict[str, bool]:
    """Run each test of NAMES in `source` against IMPLEMENTATION (or, with `liar`, a `double` whose result equals
    everything): whether it passed."""
    namespace: dict = {"__grading_other__": _other, "__grading_absent__": _absent}  # the runner's builtins
    exec(IMPLEMENTATION, namespace)
    if liar:
        class AlwaysEqual(int):
            __eq__ = lambda self, other: True  # noqa: E731
            __ne__ = lambda self, other: False  # noqa: E731
            __hash__ = int.__hash__

        real_double = namespace["double"]
        namespace["double"] = lambda x: AlwaysEqual(real_double(x))
    exec(source, namespace)
    passed = {}
    for name in NAMES:
        owner, _, method = name.partition("::")
        function = getattr(namespace[owner](), method) if method else namespace[name]
        try:
            function()
        except Exception:
            passed[name] = False
        else:
            passed[name] = True
    return passed


@pytest.mark.parametrize("seed", range(30))
def test_a_right_answer_passes_every_test_and_fails_every_twin(seed):
    twins = make_twins(TESTS, [*NAMES, "test_nothing_to_check", "test_missing"], random.Random(seed))
    assert twins.twinned == NAMES
    assert twins.untwinned == {"test_nothing_to_check": "it has no assert and no pytest.raises to mutate",
                               "test_missing": "no such test function in the file"}
    assert all(_outcomes(twins.real).values())
    assert not any(_outcomes(twins.twin).values()), twins.twin


def test_the_real_text_is_the_tests_unchanged():
    twins = make_twins(TESTS, NAMES, random.Random(0))
    assert ast.dump(ast.parse(twins.real)) == ast.dump(ast.parse(TESTS))
    assert "# a comment outside the tests" in twins.real and "# a comment outside the tests" in twins.twin


@pytest.mark.parametrize("seed", range(10))
def test_real_and_twin_have_the_same_shape_apart_from_what_they_expect(seed):
    """Same lines, same functions at the same lines, written the same way: the text's form tells neither apart."""
    twins = make_twins(TESTS, NAMES, random.Random(seed))
    assert len(twins.real.splitlines()) == len(twins.twin.splitlines())
    real, twin = ast.parse(twins.real), ast.parse(twins.twin)
    lines = lambda tree: [(n.name, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]  # noqa
    assert lines(real) == lines(twin)
    for function in [n for n in real.body if isinstance(n, ast.FunctionDef) and n.name in NAMES]:
        assert ast.unparse(function) in twins.real  # written as ast.unparse writes it, in both texts


def test_values_whose_eq_always_holds_pass_every_twin_of_an_equality():
    """`double` returning an int whose `__eq__` lies: every real test passes, and so does every twin of an `==`,
    with a literal (`== 4` -> `== 5`) or with names only (`== x + x` -> `== __grading_other__(x + x)`, issue 54: the
    twin kept the test's operator, where it used to flip it to `!=`, which the liar answers falsely too)."""
    for seed in range(10):
        twins = make_twins(TESTS, NAMES, random.Random(seed))
        assert all(_outcomes(twins.real, liar=True).values())
        twin = _outcomes(twins.twin, liar=True)
        assert twin["test_int"] and twin["TestGroup::test_method"] and twin["test_names_only"] and twin["test_all"]


class TableLiar(int):
    """Issue 54's selective liar: it answers each comparison operator from a fixed table, whatever the values."""
    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __lt__ = __le__ = lambda self, other: True  # noqa: E731
    __gt__ = __ge__ = lambda self, other: False  # noqa: E731
    __hash__ = int.__hash__


class ContainsAnything(list):
    __contains__ = lambda self, item: True  # noqa: E731


SHAPES = """
def test_name_valued(rows):
    assert parse(rows) == rows


def test_order_of_two_results():
    assert parse(1) < parse(2)


def test_membership():
    assert 3 in holder()
"""


@pytest.mark.parametrize("seed", range(10))
def test_a_liar_answering_by_a_table_per_operator_passes_every_twin_it_lies_in(seed):
    """The selective liar of issue 54 lies only where a comparison has no literal side, where the twin used to flip
    the operator (`==` -> `!=`, `<` -> `>=`, `in` -> `not in`) and its table then answered the twin falsely. The twin
    now keeps the operator (another value, the sides swapped, a value the container lacks): the liar passes it.
    (Not so a bound with a literal, `f(x) <= 5`: a liar that is "less than everything" is what the test asks for.)"""
    names = ["test_name_valued", "test_order_of_two_results", "test_membership"]
    twins = make_twins(SHAPES, names, random.Random(seed))
    for liar in (True, False):
        namespace = {"__grading_other__": _other, "__grading_absent__": _absent,
                     "parse": (lambda v: TableLiar(v[0] if isinstance(v, list) else v)) if liar else (lambda v: v),
                     "holder": (lambda: ContainsAnything()) if liar else (lambda: [3])}
        exec(twins.twin, namespace)
        for name in names:
            args = [[1, 2]] if name == "test_name_valued" else []
            try:
                namespace[name](*args)
                passed = True
            except AssertionError:
                passed = False
            assert passed is liar, (name, liar, twins.twin)  # a right answer fails every twin; the liar passes it


def test_a_one_element_list_is_never_mutated_by_repeating_its_element():
    """Issue 54's mutation tell: `== [Interval(1, 5)]` had a twin `== [Interval(1, 5), Interval(1, 5)]`, so a liar
    honest wherever the expected list had two equal neighbours resolved the task. The twin moves the call's numbers
    up together (so that `start <= end` still holds and the expected value can be built)."""
    source = "def test_x():\n    assert merge(a) == [Interval(1, 5)]\n\n\ndef test_y():\n    assert f() == [item]\n"
    changed = set()
    for seed in range(30):
        twins = make_twins(source, ["test_x", "test_y"], random.Random(seed))
        x, y = (function.body[0].test for function in ast.parse(twins.twin).body)
        (element,) = x.comparators[0].elts
        changed.add(ast.unparse(element))
        assert ast.unparse(y.comparators[0]) == "__grading_other__([item])"
    assert changed == {"Interval(2, 6)", "Interval(3, 7)"}


def test_the_run_time_other_value_has_the_type_and_shape_and_differs():
    for value in (0, 7, -1.5, True, "a", "abc", b"xy", "", [1, "a"], (2.5,), {"k": [1]}, {1, 2}, [[]], []):
        other = _other(value)
        assert type(other) is type(value) and other != value, value
        if isinstance(value, (str, bytes, list, tuple)) and value and value != [[]]:
            assert len(other) == len(value)  # a changed element, not a longer or shorter value
    assert type(_other(object())) is object
    assert _absent("a", {"a": 1, "b": 2}) not in {"a": 1, "b": 2} and _absent(3, [3, 4, 5]) not in [3, 4, 5]


def test_what_each_kind_of_check_becomes():
    twins = make_twins(TESTS, NAMES, random.Random(3))
    twin = {n.name: n for n in ast.walk(ast.parse(twins.twin)) if isinstance(n, ast.FunctionDef)}
    text = {name: ast.unparse(function) for name, function in twin.items()}
    assert "double(2) == 4" not in text["test_int"] and "double(2) ==" in text["test_int"]
    assert "name('ab')" in text["test_str_left"] and "'AB' ==" not in text["test_str_left"]
    assert "Version(2) < Version(1)" in text["test_order_and_membership"]
    assert "__grading_absent__(3, pair(3)) in pair(3)" in text["test_order_and_membership"]
    assert "4 in pair(3)" in text["test_order_and_membership"]
    assert "double(x) == __grading_other__(x + x)" in text["test_names_only"]
    assert "assert not isinstance(double(1), int)" in text["test_bare_and_negated"]
    assert "assert double(0)" in text["test_bare_and_negated"]
    assert text["test_or"].startswith("def test_or():\n    assert not (")
    assert "all((double(n) == __grading_other__(n * 2) for" in text["test_all"]
    assert "pytest.raises" not in text["test_raises_only"] and "check(-1)" in text["test_raises_only"]
    assert "pytest.raises(ValueError)" in text["test_raises_then_assert"]  # kept: the assert is mutated instead


def test_literals_change_to_another_value_of_the_same_type():
    seen = set()
    for seed in range(40):
        twins = make_twins("def test_x():\n    assert f() == ['ab', 3, 2.5, True]\n", ["test_x"], random.Random(seed))
        expected = ast.literal_eval(ast.parse(twins.twin).body[0].body[0].test.comparators[0])
        assert expected != ["ab", 3, 2.5, True] and isinstance(expected, list)
        assert all(isinstance(v, t) for v, t in zip(expected, (str, int, float, bool)) if len(expected) == 4)
        seen.add(repr(expected))
    assert len(seen) > 10  # the wrong value is drawn at random


def test_a_file_that_does_not_parse_has_no_twins():
    twins = make_twins("def test_a(:\n", ["test_a"], random.Random(0))
    assert twins.real == twins.twin == "def test_a(:\n" and twins.untwinned == {"test_a": "its file does not parse"}


@pytest.mark.parametrize("source", task_sources(), ids=lambda source: source.name)
def test_every_fail_to_pass_test_of_the_shipped_tasks_has_a_twin(source):
    row = source.row()
    tested = apply_edits(source.files_at_base(), source.tests)
    for path in dict.fromkeys(t.split("::")[0] for t in row["FAIL_TO_PASS"]):
        names = [function_name(t) for t in row["FAIL_TO_PASS"] if t.startswith(path + "::")]
        twins = make_twins(tested[path], names, random.Random(0))
        assert twins.twinned == names and twins.untwinned == {}


def test_a_test_passing_with_its_twin_is_tampering_and_an_unchecked_pass_is_not_trusted():
    real = {"t.py::a": "PASSED", "t.py::b": "FAILED", "t.py::c": "PASSED"}
    assert judge_twins(real, {"t.py::a": "FAILED", "t.py::b": "PASSED", "t.py::c": "ERROR"}, ["t.py::a", "t.py::b",
                                                                                              "t.py::c"], "") == ""
    problem = judge_twins(real, {"t.py::a": "PASSED", "t.py::c": "FAILED"}, ["t.py::a", "t.py::c"], "")
    assert problem.startswith("tampering: the twins of 1 passing tests") and "t.py::a" in problem
    assert judge_twins(real, {"t.py::a": "XFAIL"}, ["t.py::a"], "").startswith("tampering")
    assert judge_twins(real, {}, ["t.py::a"], "") == "the twins of 1 passing tests did not fail (t.py::a: not run)"
    assert judge_twins(real, {"t.py::a": "SKIPPED"}, ["t.py::a"], "").startswith("the twins of 1")
    assert judge_twins(real, {"t.py::a": "FAILED"}, ["t.py::a"], "tampering: 2 lines").startswith(
        "tampering (in the twin run)")
    assert judge_twins(real, {"t.py::a": "FAILED"}, ["t.py::a"], "the test run ended before pytest finished") == (
        "the twin run did not run properly: the test run ended before pytest finished")
    assert judge_twins({"t.py::b": "FAILED"}, {}, ["t.py::b"], "the test run ended") == ""  # nothing to vouch for


def test_twins_are_judged_even_when_another_test_file_broke():
    """Issue 54, found by reading: twin judging was skipped whenever the real run reported any problem, so breaking one
    file's must-pass canary on purpose left every other file's passes unjudged."""
    from trl_multiturn.envs.swegym.grading import _Run, twin_verdict

    broken = "the tests of ['tests/test_b.py'] did not run properly"
    real = _Run(applied=True, outcomes={"tests/test_a.py::f": "PASSED", "tests/test_b.py::g": "FAILED"},
                problem=broken, twinned=["tests/test_a.py::f"])
    lying = _Run(applied=True, outcomes={"tests/test_a.py::f": "PASSED", "tests/test_b.py::g": "FAILED"})
    outcomes, problem = twin_verdict(real, lying)
    assert problem.startswith("tampering: the twins of 1") and broken in problem
    assert set(outcomes.values()) == {"FAILED"}
    honest = _Run(applied=True, outcomes={"tests/test_a.py::f": "FAILED", "tests/test_b.py::g": "FAILED"})
    assert twin_verdict(real, honest) == (real.outcomes, broken)  # the other file's pass stands, the broken one fails
