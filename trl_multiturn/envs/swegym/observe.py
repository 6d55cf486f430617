"""Observation form of a test file: every check reports the values it looks at, and nothing it expects.

The verdict on a test is computed outside the sandbox (`grading.py`), by comparing what the patch's code produced
with what the gold patch's code produced for the same text, in a sandbox of its own. So the text the patch's
sandbox runs must hold no expected value: `observe(source, rng)` rewrites every function of a test module so that

- `assert A == B` (also `!=`, `is`, `is not`, `<`, `<=`, `>`, `>=`) where one side is *data* (literals, containers
  of data, a class called on data like `Interval(1, 5)`, `pytest.approx(...)`, `None`, a name bound to nothing but
  literals and never changed in place, `EXPECTED = {...}`, whose assignment goes when nothing else reads it, a
  `parametrize` argument of literals of any kind (numbers, strs, None, lists, tuples, dicts), whose column
  becomes None when nothing else reads it, the test ids kept, or a name a loop over a literal table binds, `for
  expr, want in [("3 4 -", -1), ...]`, whose column becomes None when nothing else reads it, so the loop's frame
  does not hold it either; a table bound to a name, `CASES = [...]` then `for expr, want in CASES` or
  `parametrize("expr, want", CASES)`, is written where it is read first, so it is one of these) reports the
  other side's value and drops the data side: `assert f(x) == 4`, `assert f(x) != 4`, `assert f(x) < 10`,
  `assert f(x) is None` all become `__check__(lambda: f(x)[, "compared"])`, so the operator, the bound and the
  expected value are all gone. "compared" (COMPARED: any of `==`, `!=`, an ordering, `in`; not an identity)
  tells the runner that an operator decided against a value the text no longer holds: where the value is an
  object whose comparison operators are the repository's own code, that operator, not the state reported,
  decided, so the check is *blind* and the host fails the test (fail closed, `integrity.is_unobserved`);
- where the data side builds an object (`Version(1, 0, 0)`, `[Interval(1, 5)]`: a class called), its class's
  operator is the package's code: the comparison is reported too (`latest(v) == Version(1, 0, 0)`, `x in
  Interval(1, 5)`, an ordering both ways) and that data side stays in the text;
- where neither side is data, both sides' values are reported and the comparison too (an identity: the values
  only), and for an ordering (also between two data sides, `Version(1, 2) < Version(1, 10)`) the comparison both
  ways (`a < b` and `b < a`), so a comparison that answers True to everything is told from a right one;
- `x in c` / `x not in c` reports the item's value when the container is data (COMPARED), else whether `x in c`;
- `assert c` / `assert not c` (a bare truth) reports `c`'s value and what `bool(c)` answers (TRUTH: a
  `__bool__` or `__len__` of the package decides); `assert p and q` is two checks;
- `with pytest.warns(W[, match=r])`, `pytest.deprecated_call()` and `self.assertWarns(W)` become
  `with __warned__(message):`, which reports the category of each warning the body gave, and its message where
  the test matched one (W and r gone, as a raises block's exception is); `pytest.warns(W, f, x)` and
  `self.assertWarns(W, f, x)` report `f(x)` inside such a block;
- an assertion helper (`self.assertEqual(a, b)`, `np.testing.assert_allclose(a, b)`: a call named `assert...`)
  reports its arguments that are not data and is not called (COMPARED where unittest's operator helper dropped a
  data argument, TRUTH for `assertTrue`/`assertFalse`), but one given the code to call
  (`self.assertRaises(E, f, x)`, `assertRaisesRegex(E, r, f, x)`, `pytest.raises(E, f, x)`)
  reports what `f(x)` returns or raises, as a call made as a statement does; any other call made as a statement
  reports its value, or the exception it raised (a test that only checks that nothing raises is observed too), and
  in the body of a `try` with handlers lets that exception through to them;
- `with pytest.raises(E): body` (or `self.assertRaises(E)`) becomes a `try` that reports which exception, if any,
  ended the body (drafts change a constant of the body), and its message too where the test matched one
  (`match=`, `assertRaisesRegex`); the body's calls report their values and let the exception through; with
  `as info`, `info` is bound to what the original body raised (`__caught__`), so the checks after the block read
  the exception the code raised, not one a replaced `pytest.raises` made up;
- inside a reported expression, every call (but builtins and pytest's) reports its own value too (`__value__`),
  so a round trip (`decode(encode(x)) == x`) reports the encoding as well: an encoder that tags its output and a
  decoder that returns the tag's input differ from the gold patch's encoding;
- each check of a FAIL_TO_PASS test reports `drafts` copies of it with one constant changed (`f(3)` -> `f(5)`), and
  one with a list or tuple reversed, where it has such; their right answer is whatever the gold patch answers,
  computed in its own run: a value read back from the test's text, a table of the inputs seen, a constant that is
  right for the test's own inputs, or an answer by position (the first element) answers the original check but
  not these;
- a FAIL_TO_PASS test as a whole has drafts too, for the inputs it binds outside its checks (`expression = "3 4 -"`
  before `assert evaluate(expression) == -1`, a loop's table, a fixture of the module returning `"8 2 /"`) and
  those it receives when it runs (a fixture of conftest.py, one with `params=` or `yield`, a `parametrize` row):
  after its body, `drafts` copies of the body (and one with a list reversed), each with one constant outside the
  checks changed, in the body or in the body of a fixture the test requests (run again for that draft:
  `@pytest.fixture` functions of the module or the test's class, no `params=`, no `yield`, whose own parameters
  the test requests too), and, for each other parameter the body reads (not a dropped column) and each value the
  module binds by an assignment that the body reads (`CASES = build_cases()`), `drafts` copies given its value
  changed as the test runs (`__varied__(expression, seed)`: one int, float or str in it, at any
  depth of its lists, tuples and dicts, changed as a constant of the text is, `variation.varied`; a value with
  none, such as `tmp_path`, runs no copy); each copy is a function of the test's parameters, run after the
  original body (whose outcome its state cannot change), and `__check__` reports what it returns or raises, its
  checks their values;
- `if C: raise AssertionError(...)` (`pytest.fail(...)`, `self.fail(...)`) with no `else`, a branch that only
  fails the test, is observed as `assert not C` is; an assert no lambda can hold (`:=`, `yield`, `await`) stays
  as written, and the calls in it report their values (`__value__`); any other `if` (a branch raising another
  exception, which may be a skip, or doing more) stays, and its condition's calls report their values;
  a value bound to a name that such a condition or assert reads reports its value where it is bound
  (`got = __value__(evaluate(x))`; by a loop or a `with ... as`, at the top of its body; by an `except ... as`,
  with its arguments): none decides by a value no report shows;
- a name bound once to an immutable literal (`SUBTRACTION = "3 4 -"` at module level) is written wherever a
  function reads it (`_Inlined`), so the check or body that reads it holds the constant its drafts change;
- docstrings, comments and assert messages are dropped (they may state the expected values).

The verdict does not depend on telling a draft from the original: every reported value is compared, so there is
nothing to gain from recognising one. A draft is text like the original, the same text in both runs, so a right
fix reports the gold patch's values on it as on the original, as long as the test is deterministic. `__check__`,
`__value__`, `__raised__`, `__caught__`, `__warned__` and `__varied__` are builtins that `pytest_runner.py`
installs; they report each value as plain data (`pytest_runner._plain`), never a pickle.

Pure: `observe` returns the rewritten module text (`ast.unparse`).
"""

from __future__ import annotations

import ast
import builtins
import copy
import random
from collections import Counter

from .variation import changed

CHECK, VALUE, RAISED, CAUGHT, WARNED, VARIED = (
    "__check__", "__value__", "__raised__", "__caught__", "__warned__", "__varied__")
COMPARED, TRUTH = "compared", "truth"  # how a check decided, where the form dropped what it decided against
_BUILTINS = set(dir(builtins))
_ORDERINGS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _name(node: ast.expr) -> str:
    """`a.b.C` of a Name/Attribute chain, or ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _name(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def is_data(node: ast.expr, names: frozenset[str] = frozenset()) -> bool:
    """Whether `node` is an expected value rather than a computation: literals, containers of data, `-x`, a class
    (a capitalised name) or `pytest.approx` called on data, and `names` (bound to data only: `_data_names`)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(is_data(e, names) for e in node.elts if not isinstance(e, ast.Starred))
    if isinstance(node, ast.Dict):
        return all(k is None or is_data(k, names) for k in node.keys) and all(is_data(v, names) for v in node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return is_data(node.operand, names)
    if isinstance(node, ast.Call):
        name = _name(node.func)
        last = name.rsplit(".", 1)[-1]
        return bool(last) and (last[:1].isupper() or name.endswith("approx")) and all(
            is_data(a, names) for a in node.args) and all(is_data(k.value, names) for k in node.keywords)
    return False


def _constructed(node: ast.expr) -> bool:
    """Whether a data side builds an object (`Version(1, 0, 0)`, `[Interval(1, 5)]`): its class's operators are
    the package's code, so the relation is an answer of the code under test (not `pytest.approx(...)`)."""
    return any(isinstance(n, ast.Call) and not _name(n.func).endswith("approx") for n in ast.walk(node))


def _checks(test: ast.expr, names: frozenset[str]) -> list[tuple[ast.expr, str | None]]:
    """The expressions whose values an `assert test` reports (see the module docstring), each with how it was
    checked, for `pytest_runner._Observations.check`: COMPARED where the form dropped a written expected side of
    `==`, `!=`, an ordering or `in` (which operator is not said), TRUTH for a bare truth (`bool` of it is
    reported), else None (an identity, or a check whose sides are all in the text); `names` count as data."""

    def is_data_(node: ast.expr) -> bool:
        return is_data(node, names)

    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for value in test.values for c in _checks(value, names)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _checks(test.operand, names) if isinstance(test.operand, ast.BoolOp) else [(test.operand, TRUTH)]
    if not isinstance(test, ast.Compare):
        return [(test, TRUTH)]
    if len(test.ops) > 1:
        return [(test, None), *((e, None) for e in [test.left, *test.comparators] if not is_data_(e))]
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, (ast.In, ast.NotIn)):
        membership = ast.Compare(left=left, ops=[ast.In()], comparators=[right])
        if is_data_(right):  # `x in Interval(1, 5)`: the container's `__contains__` is the package's, so it stays
            return [(left, None), (membership, None)] if _constructed(right) else [(left, COMPARED)]
        return [(membership, None)]
    ordering = isinstance(op, _ORDERINGS)
    if is_data_(right) != is_data_(left):
        computed, data = (left, right) if is_data_(right) else (right, left)
        if isinstance(op, (*_ORDERINGS, ast.Eq, ast.NotEq)) and _constructed(data):
            # `parse(a) < Version(1, 0, 0)`, `latest(v) == Version(1, 0, 0)`: the operator is the package's, so the
            # comparison is reported (an ordering both ways) and that data side stays
            both = [ast.Compare(left=right, ops=[op], comparators=[left])] if ordering else []
            return [(computed, None), (test, None), *((c, None) for c in both)]
        return [(computed, COMPARED if isinstance(op, (*_ORDERINGS, ast.Eq, ast.NotEq)) else None)]
    both_ways = [test, ast.Compare(left=right, ops=[op], comparators=[left])] if ordering else [test]
    if is_data_(left):  # data on both sides (`Version(1, 2) < Version(1, 10)`): only the comparison is computed
        return [(c, None) for c in both_ways]
    if isinstance(op, (ast.Is, ast.IsNot)):
        return [(left, None), (right, None)]
    return [(c, None) for c in [left, right, *both_ways]]  # the operator (the package's `__eq__`) too


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _data_names(tree: ast.Module) -> frozenset[str]:
    """The names whose every binding in the module is `NAME = <literal>` (`EXPECTED = {...}`, `expected = [1, 2]`)
    and that nothing changes in place (no attribute, method or item of theirs is used: `calls.append(x)`) or
    reads as an attribute (`self.EXPRESSION` of a class attribute, which no name reads): on the expected side of a
    check they are data, and their assignment goes once nothing else reads them. An object made by a class (`cache
    = LRUCache(2)`) is not: it is what the test works on."""
    data, bindings = Counter(), Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            data[node.targets[0].id] += _is_literal(node.value)
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, ast.Name):
            bindings[node.value.id] += 1  # used in place: never counts as data
        if isinstance(node, ast.Attribute):
            bindings[node.attr] += 1  # read as an attribute (`self.EXPRESSION` of a class attribute): not data
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bindings[node.id] += 1
        elif isinstance(node, ast.arg):
            bindings[node.arg] += 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bindings[node.name] += 1
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bindings.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bindings.update(node.names)
    return frozenset(name for name, count in data.items() if count and count == bindings[name])


def _assigned(tree: ast.Module) -> set[str]:
    """The names the module's own statements bind by an assignment (`CASES = build_cases()`, `BASE = {...}`): values
    a test may read as inputs; not its functions, classes or imports."""
    return {n.id for statement in tree.body if isinstance(statement, (ast.Assign, ast.AnnAssign))
            for target in (statement.targets if isinstance(statement, ast.Assign) else [statement.target])
            for n in ast.walk(target) if isinstance(n, ast.Name)}


def _tables(tree: ast.Module, names: frozenset[str]) -> dict[str, ast.expr]:
    """The data names (`_data_names`) bound once, by the literal they are bound to: a table a loop or a parametrize
    reads by name (`CASES = [("3 4 -", -1), ...]`) is written there instead (`_Table`, `_Columns`), and the
    assignment goes once nothing else reads the name."""
    values: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and (
                node.targets[0].id in names):
            values.setdefault(node.targets[0].id, []).append(node.value)
    return {name: bound[0] for name, bound in values.items() if len(bound) == 1}


class _Inlined(ast.NodeTransformer):
    """Write, in every function, each name of `tables` bound to an immutable literal (a str, a number, None, a
    tuple of those: `SUBTRACTION = "3 4 -"`) where it is read, so that a check or the body it is read in holds the
    constant, which drafts change (a module constant is in no body). Not a list, dict or set: a test may hand one
    to code that fills it, and a copy at each read would lose that."""

    def __init__(self, tables: dict[str, ast.expr]):
        self.tables = {name: value for name, value in tables.items() if not any(
            isinstance(n, (ast.List, ast.Dict, ast.Set)) for n in ast.walk(value))}
        self.functions = 0

    def visit_FunctionDef(self, node):
        self.functions += 1
        self.generic_visit(node)
        self.functions -= 1
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Name(self, node: ast.Name):
        if self.functions and isinstance(node.ctx, ast.Load) and node.id in self.tables:
            return copy.deepcopy(self.tables[node.id])
        return node


class _DeadData(ast.NodeTransformer):
    """Drop the assignments of data names nothing reads any more (their values were expected sides)."""

    def __init__(self, dead: set[str]):
        self.dead = dead

    def visit_Assign(self, node: ast.Assign):
        target = node.targets[0]
        return None if isinstance(target, ast.Name) and target.id in self.dead else node

    def generic_visit(self, node):
        super().generic_visit(node)
        if isinstance(getattr(node, "body", None), list) and not node.body:
            node.body = [ast.Pass()]  # a block left empty
        return node


def _call(name: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=list(args), keywords=[])


class _ValueCalls(ast.NodeTransformer):
    """Wrap every call but builtins' and pytest's in `__value__(...)`, which reports its value."""

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        name = _name(node.func)
        if name in _BUILTINS or name.split(".")[0] == "pytest":
            return node
        return _call(VALUE, node)

    def visit_Lambda(self, node):  # a callback's calls happen where the package calls them
        return node


def _constants(node: ast.AST, walk=ast.walk) -> list[ast.Constant]:
    """The int, float and str constants of `node` (among the nodes `walk(node)` gives) that a draft may change."""
    return [c for c in walk(node) if isinstance(c, ast.Constant) and type(c.value) in (int, float, str)]


def _inputs(node: ast.AST):
    """The nodes of `node` (`ast.walk`'s) but those of the checks' reports (`__check__`, `__raised__`,
    `__warned__`: their constants have drafts of their own, or say how a check decided) and of asserts left as
    written: the inputs a test binds outside its checks. A step's report (a call made as a statement,
    `cache.put("a", 1)`: `_STEP`) is no check: its constants are inputs."""
    todo = [node]
    while todo:
        node = todo.pop(0)
        yield node
        todo += [child for child in ast.iter_child_nodes(node) if not isinstance(child, ast.Assert) and not (
            isinstance(child, ast.Call) and _name(child.func) in (CHECK, RAISED, WARNED)
            and not getattr(child, _STEP, False))]


_STEP = "step"  # the attribute that marks a step's `__check__` call in the tree (kept by `copy.deepcopy`)
# A test's body is drafted twice for each of its input constants, up to this many drafts (each constant once
# before any twice): a special case of one input among many (one row of a long table, one call of a scenario) is
# varied in every grading, where three drafts of one constant each missed it in most (the wave 11 review,
# "dilution"), and twice, since one changed value may hide the bug as well as the special case does (an input
# every version rejects). Each draft runs the whole body once more, in both runs: the cap bounds that cost.
BODY_DRAFTS = 24


def _copy(node: ast.expr) -> ast.expr:
    return ast.parse(ast.unparse(node), mode="eval").body


def _sequences(node: ast.AST, walk=ast.walk) -> list[ast.List | ast.Tuple]:
    """The list and tuple displays of `node` (among `walk(node)`, not an assignment's targets) with two or more
    different elements, that a draft may reverse."""
    return [s for s in walk(node) if isinstance(s, (ast.List, ast.Tuple)) and isinstance(s.ctx, ast.Load)
            and len({ast.dump(e) for e in s.elts}) > 1 and not any(isinstance(e, ast.Starred) for e in s.elts)]


def _drafts(node: ast.AST, drafts: int, rng: random.Random, walk=ast.walk, each: int = 0) -> list:
    """Copies of `node` (an expression or a statement): with `each`, two for each of its constants with that
    constant changed (`each` at most: every constant once before any twice, in an order drawn at random); then,
    until there are `drafts`, different ones with a constant drawn at random changed (fewer where it has fewer);
    and one with a list or tuple of several elements reversed (none of either kind when it has none); `walk(node)`
    gives the nodes a draft may change."""
    out, seen = [], set()
    count = len(_constants(node, walk)) if drafts else 0

    def add(index: int) -> None:
        draft = copy.deepcopy(node)
        constant = _constants(draft, walk)[index]
        constant.value = changed(constant.value, rng)
        if ast.dump(draft) not in seen:
            seen.add(ast.dump(draft))
            out.append(draft)

    for index in (rng.sample(range(count), count) * 2)[:each]:  # each constant once, then once more
        add(index)
    drafts = max(drafts, len(out))
    for _ in range(20 * drafts if count else 0):  # different drafts, where there are enough
        if len(out) == drafts:
            break
        add(rng.randrange(count))
    if drafts and _sequences(node, walk):
        draft = copy.deepcopy(node)
        rng.choice(_sequences(draft, walk)).elts.reverse()
        out.append(draft)
    return out


_NEGATED = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
            ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def _negated(test: ast.expr) -> ast.expr:
    """`not test`, written as `_checks` reads a check: `not C` -> `C`, and a single comparison with its operator
    turned (`got != -1` -> `got == -1`), so that its sides are reported rather than what the operator answered."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        return ast.Compare(left=test.left, ops=[_NEGATED[type(test.ops[0])]()], comparators=test.comparators)
    return ast.UnaryOp(op=ast.Not(), operand=test)


def _fails(statement: ast.stmt) -> bool:
    """Whether `statement` fails the test: `raise AssertionError(...)`, `pytest.fail(...)`, unittest's
    `self.fail(...)` (another exception may be a skip, `raise unittest.SkipTest(...)`: not a check)."""
    if isinstance(statement, ast.Raise):
        error = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
        return error is not None and _name(error) == "AssertionError"
    call = statement.value if isinstance(statement, ast.Expr) else None
    return isinstance(call, ast.Call) and _name(call.func) in ("pytest.fail", "self.fail")


def _unobservable(node: ast.AST) -> bool:
    """A lambda cannot hold these, so the check stays as it is."""
    return any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr)) for n in ast.walk(node))


def _docstring_free(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
            body[0].value.value, str):
        body = body[1:]
    return body or [ast.Pass()]


def _is_raises(item: ast.withitem) -> bool:
    call = item.context_expr
    return isinstance(call, ast.Call) and _name(call.func).rsplit(".", 1)[-1] in (
        "raises", "assertRaises", "assertRaisesRegex")


# Assertion helpers that call the code under test themselves, given as a callable (`assertRaises(E, f, x)`): the
# position of the callable among their arguments; those of warnings report the warnings the call gave too.
_RAISES_HELPERS = {"raises": 1, "assertRaises": 1, "assert_raises": 1, "failUnlessRaises": 1,
                   "assertRaisesRegex": 2, "assertRaisesRegexp": 2, "assert_raises_regex": 2}
_WARNS_HELPERS = {"warns": 1, "deprecated_call": 0, "assertWarns": 1, "assertWarnsRegex": 2}


def _warns_block(item: ast.withitem) -> ast.Call | None:
    """`with pytest.warns(W[, match=r])`, `pytest.deprecated_call()`, `self.assertWarns(W)`,
    `self.assertWarnsRegex(W, r)`: the block's `__warned__(message)` in observation form (W and r gone), or None."""
    call = item.context_expr
    if not isinstance(call, ast.Call):
        return None
    name = _name(call.func).rsplit(".", 1)[-1]
    if name not in _WARNS_HELPERS or len(call.args) > _WARNS_HELPERS[name]:
        return None
    message = any(k.arg == "match" for k in call.keywords) or name.endswith("Regex")
    return _call(WARNED, ast.Constant(message))


# unittest's helpers that decide by an operator of their arguments (`first == second`, `member in container`)
_OPERATOR_HELPERS = {"assertEqual", "assertEquals", "failUnlessEqual", "assertNotEqual", "assertNotEquals",
                     "failIfEqual", "assertIn", "assertNotIn", "assertLess", "assertLessEqual", "assertGreater",
                     "assertGreaterEqual", "assertListEqual", "assertTupleEqual", "assertDictEqual", "assertSetEqual",
                     "assertSequenceEqual", "assertMultiLineEqual"}


def _helper_relation(name: str, dropped: bool) -> str | None:
    """How an assertion helper `name` decides (`_checks`): TRUTH for `assertTrue`/`assertFalse`, COMPARED for one
    of unittest's that compare by an operator (`assertEqual`, `assertIn`, `assertLess`...) whose data argument was
    dropped, else nothing (an identity such as `assertIsNone`, or a library's helper such as
    `assert_frame_equal`, which compares what the values hold, as the reported state does)."""
    if name in ("assertTrue", "assertFalse", "assert_", "failUnless", "failIf"):
        return TRUTH
    return COMPARED if dropped and name in _OPERATOR_HELPERS else None


def _is_assertion_call(node: ast.expr) -> bool:
    """`self.assertEqual(a, b)`, `np.testing.assert_allclose(a, b)`, `assert_frame_equal(a, b)`: a check made by a
    call whose name starts with `assert`."""
    return isinstance(node, ast.Call) and _name(node.func).rsplit(".", 1)[-1].lower().startswith("assert")


def _loads(node: ast.AST) -> Counter:
    """How often each name is read in `node`."""
    return Counter(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def _decisive(function: ast.AST) -> set[str]:
    """The names read by a decision of `function` that no check reports: the condition of an `if` and an assert
    left as written (`_unobservable`). Not a `while` condition: a polling loop's clock (`time.monotonic() <
    deadline`) would be reported, a value no two runs share."""
    decisions = [n.test for n in ast.walk(function) if isinstance(n, ast.If)
                 or isinstance(n, ast.Assert) and _unobservable(n.test)]
    return set(_loads(ast.Module(body=[ast.Expr(d) for d in decisions], type_ignores=[])))


def _parameters(function: ast.FunctionDef) -> list[str] | None:
    """The names of `function`'s parameters, or None where it takes `*args` or `**kwargs`."""
    arguments = function.args
    if arguments.vararg or arguments.kwarg:
        return None
    return [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]


def _function(name: str, parameters: list[str], body: list[ast.stmt]) -> ast.FunctionDef:
    return ast.FunctionDef(name=name, args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in parameters],
                                                         kwonlyargs=[], kw_defaults=[], defaults=[]),
                           body=body, decorator_list=[], returns=None, type_params=[])


def _fixtures(tree: ast.Module) -> dict[tuple[str, str], ast.FunctionDef]:
    """The fixtures a test module defines that a draft of a test may run again with a constant changed, by (the
    class they are defined in, or "", the name a test requests them by): `@pytest.fixture` functions (no `params=`,
    no `yield`, no `*args`) of the module or of a class."""
    out = {}
    for scope, statements in [("", tree.body), *((c.name, c.body) for c in tree.body if isinstance(c, ast.ClassDef))]:
        for node in statements:
            if not isinstance(node, ast.FunctionDef) or _parameters(node) is None or any(
                    isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in ast.walk(node)):
                continue
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                if _name(call.func if call else decorator).rsplit(".", 1)[-1] != "fixture" or call and (
                        call.args or any(k.arg == "params" for k in call.keywords)):
                    continue
                named = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"
                         and isinstance(k.value, ast.Constant)]
                out[scope, named[0] if named else node.name] = copy.deepcopy(node)
    return out


class _Observe(ast.NodeTransformer):
    def __init__(self, rng: random.Random, drafts: int, drafted: set[str], names: frozenset[str],
                 fixtures: dict[tuple[str, str], ast.FunctionDef], tables: dict[str, ast.expr], module: set[str]):
        self.rng, self.drafts, self.drafted, self.names, self.fixtures = rng, drafts, drafted, names, fixtures
        self.tables = tables  # the data names bound once, by their literal (`_tables`)
        self.globals = module  # the names the module binds by an assignment (`_assigned`)
        self.scope: list[str] = []  # the names of the classes and functions the visit is in
        self.functions = 0  # how many functions deep
        self.draft = False
        self.raising = False  # in the body of a `pytest.raises` block or of a `try` with handlers
        self.loads = Counter()  # how often each name is read in the (original) function the visit is in
        self.decisive: set[str] = set()  # the names that decide a branch of that function (`_decisive`)

    def _scoped(self, node):
        self.scope.append(node.name)
        inner = not isinstance(node, ast.ClassDef)
        self.functions += inner
        test = inner and not self.draft and "::".join(self.scope) in self.drafted
        outer, self.draft = self.draft, self.draft or test
        outer_loads, self.loads = self.loads, _loads(node) if inner else self.loads
        outer_decisive, self.decisive = self.decisive, _decisive(node) if inner else self.decisive
        original = copy.deepcopy(_docstring_free(node.body))
        decorators = getattr(node, "decorator_list", [])
        outer_names, columns = self.names, [c for d in decorators if (c := _Columns.of(d, self.tables))]
        self.names = self.names | {name for c in columns for name in c.data}
        node.body = [s for statement in node.body for s in _listed(self.visit(statement))]
        if test and isinstance(node, ast.FunctionDef):
            node.body += self._test_drafts(node, original)
        self.names = outer_names
        read = set(_loads(ast.Module(body=node.body, type_ignores=[])))
        for column in columns:
            column.drop(set(column.data) - read)
        self.scope.pop()
        self.functions -= inner
        self.draft, self.loads, self.decisive = outer, outer_loads, outer_decisive
        node.body = _docstring_free(node.body)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _plain(self, body: list[ast.stmt]) -> list[ast.stmt]:
        """`body` (a copy) in observation form without drafts of its checks, and without the assignments of data
        names it no longer reads (`_DeadData`)."""
        outer, self.draft = self.draft, False
        body = [s for statement in copy.deepcopy(body) for s in _listed(self.visit(statement))]
        self.draft = outer
        read = _loads(ast.Module(body=body, type_ignores=[]))
        return _DeadData({n for n in self.names if not read[n]}).visit(ast.Module(body=body, type_ignores=[])).body

    def _test_drafts(self, node: ast.FunctionDef, original: list[ast.stmt]) -> list[ast.stmt]:
        """Drafts of the test `node` as a whole, for the inputs it binds outside its checks (`expression = "3 4 -"`
        before `assert evaluate(expression) == -1`, a fixture of the module returning `"8 2 /"`) and those it
        receives when it runs (a fixture of conftest.py, one with `params=` or `yield`, a parametrize row of any
        values): copies of its body (`original`) run after it, each with one constant outside the checks changed
        (two for each such constant, `BODY_DRAFTS` at most, the constants of calls made as statements included: a
        step's inputs), or a list reversed, in the body or in the body of a fixture of the module the test requests
        (run again for that draft, its value passed for the fixture's), and, for each other parameter the body reads
        and each value of the module it reads (a name the module binds by an assignment: `CASES = build_cases()`),
        `drafts` copies given its value changed when the test runs (`__varied__`: one int, float or str in it, drawn
        by a seed written here, `variation.varied`; a value with none, an object the test works on, runs no copy);
        each copy is a function of the test's parameters, `__check__` reports what it returns or raises, and its
        checks report their values as the test's do. None where the test's body has `yield` or `await`, or takes
        `*args`."""
        parameters = _parameters(node)
        if parameters is None or any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in ast.walk(node)):
            return []
        body, every = self._plain(original), set(parameters)
        used = _loads(ast.Module(body=body, type_ignores=[]))
        parameters = [p for p in parameters if used[p]]  # not a dropped parametrize column: its values went
        local = every | {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        local |= {name for n in ast.walk(node) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
        inputs = parameters + sorted(name for name in self.globals if used[name] and name not in local)
        fixtures = {}
        for parameter in parameters:
            fixture = self.fixtures.get((self.scope[-2] if len(self.scope) > 1 else "", parameter)) or \
                      self.fixtures.get(("", parameter))
            if fixture is not None and set(_parameters(fixture)) <= every:
                fixtures[parameter] = _function(f"__{parameter}__", _parameters(fixture),
                                                self._plain(_docstring_free(fixture.body)))
        plain = ast.Module(body=[_function("__draft__", inputs, body), *fixtures.values()], type_ignores=[])
        drafts = []  # (the copy of the body, the functions it needs, the arguments passed instead of the test's)
        for draft in _drafts(plain, self.drafts, self.rng, walk=_inputs, each=BODY_DRAFTS):
            function, *defined = draft.body
            redone = {p: f for p, f, was in zip(fixtures, defined, fixtures.values()) if ast.dump(f) != ast.dump(was)}
            drafts.append((function, list(redone.values()), {p: _call(f.name, *(
                ast.Name(id=a.arg, ctx=ast.Load()) for a in f.args.args)) for p, f in redone.items()}))
        for name in inputs:
            if name not in fixtures and name != "self":
                drafts += [(copy.deepcopy(plain.body[0]), [], {name: _call(
                    VARIED, ast.Name(id=name, ctx=ast.Load()), ast.Constant(self.rng.randrange(2 ** 32)))})
                    for _ in range(self.drafts)]
        out = []
        for function, defined, replaced in drafts:
            run = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                             body=_call(function.name, *(replaced.get(p, ast.Name(id=p, ctx=ast.Load()))
                                                         for p in inputs)))
            out += [function, *defined, ast.Expr(_call(CHECK, run))]
        return out

    def visit_For(self, node: ast.For):
        """A loop over a literal table (`for expr, want in [("3 4 -", -1), ...]`) binds data, as a parametrize
        list does: its names count as data in the loop's checks, and a column whose name nothing reads once the
        checks dropped their expected sides (nor anything outside the loop) becomes None (`_Table`). A table bound
        to a name (`CASES = [...]` then `for expr, want in CASES`, `_tables`) is written in the loop, so its
        expected column goes and its inputs are drafted with the body, as a written one's are."""
        if self.functions and isinstance(node.iter, ast.Name) and node.iter.id in self.tables:
            node.iter = copy.deepcopy(self.tables[node.iter.id])
        table = _Table.of(node)
        if table is None or not self.functions:
            self.generic_visit(node)
            node.body[:0] = self._bound(node.target)  # a computed iterable's items, where a decision reads them
            return node
        outside = self.loads - _loads(node)
        outer, self.names = self.names, self.names | set(table.names)
        self.generic_visit(node)
        self.names = outer
        read = _loads(ast.Module(body=[*node.body, *node.orelse], type_ignores=[]))
        table.drop({n for n in table.names if not read[n] and not outside[n]})
        return node

    def visit_Try(self, node: ast.Try):
        """A `try` with handlers: its body's call statements let their exceptions through to the handlers (as in
        a raises block), so `try: f() except E: pass else: raise AssertionError` decides as written (a
        `__check__` swallowed the exception: the `else` failed the test, the gold patch's run too)."""
        if not node.handlers:
            return self.generic_visit(node)
        outer, self.raising = self.raising, True
        node.body = [s for statement in node.body for s in _listed(self.visit(statement))]
        self.raising = outer
        for field in ("handlers", "orelse", "finalbody"):
            setattr(node, field, [s for statement in getattr(node, field) for s in _listed(self.visit(statement))])
        return node

    def visit_Expr(self, node: ast.Expr):
        """A call as a statement reports its value (or what it raised); an assertion helper reports its arguments
        that are not data, and is not called (its data arguments are the expected values)."""
        call = node.value
        if not self.functions or not isinstance(call, ast.Call) or _unobservable(call):
            return node
        name = _name(call.func).rsplit(".", 1)[-1]
        index = _RAISES_HELPERS.get(name, _WARNS_HELPERS.get(name))
        if index is not None and len(call.args) > index and not any(
                isinstance(a, ast.Starred) for a in call.args[:index + 1]):
            # `assertRaises(E, f, *args, **kwargs)`, `pytest.raises(E, f, *args)`: the helper calls the code under
            # test; what `f(*args)` returns or raises is reported, and E (the expected exception) goes; for a
            # warning's helper (`assertWarns(W, f, x)`), the warnings the call gave too
            keywords = [k for k in call.keywords if k.arg != "match"]
            observed = self._observed([(ast.Call(func=call.args[index], args=call.args[index + 1:],
                                                 keywords=keywords), None)])
            if name not in _WARNS_HELPERS:
                return observed
            return ast.With(items=[ast.withitem(context_expr=_warns_block(ast.withitem(context_expr=ast.Call(
                func=call.func, args=call.args[:index], keywords=call.keywords))))], body=observed)
        if _name(call.func).split(".")[0] == "pytest":  # pytest's control flow (skip, fail)
            return node
        if self.raising:  # in a `pytest.raises` block: its exception must end the block
            return ast.Expr(_ValueCalls().visit(_copy(call)))
        if _is_assertion_call(call):
            arguments = [*call.args, *(k.value for k in call.keywords if k.arg != "msg")]
            checks = [a for a in arguments if not is_data(a, self.names)]
            relation = _helper_relation(name, len(checks) < len(arguments))
            return self._observed([(c, relation) for c in checks] or [(call, None)])
        return self._observed([(call, None)], drafted=False)  # a step of the test, not a check: its inputs stay

    def visit_Assert(self, node: ast.Assert):
        if _unobservable(node.test):  # kept as written (no lambda can hold it), but what its calls return is reported
            return ast.Assert(test=_ValueCalls().visit(node.test), msg=None)
        return self._observed(_checks(node.test, self.names))

    def visit_If(self, node: ast.If):
        """`if C: raise AssertionError(...)` (or `pytest.fail(...)`, `self.fail(...)`) with no `else` is the test's
        check that C is false: observed as `assert not C` is, so C's values are reported and its expected side goes.
        Run as written, the branch was decided by an operator of whatever the package returned, which no report
        showed (a value equal to everything, outside the checks, passed it). Any other branch (one raising another
        exception, one with other statements) stays, and the calls of C report their values (`__value__`), as the
        values bound to its names do (`visit_Assign`)."""
        if self.functions and not node.orelse and all(_fails(s) for s in node.body) and not _unobservable(node.test):
            return self.visit_Assert(ast.Assert(test=_negated(node.test), msg=None))
        self.generic_visit(node)
        if self.functions:
            node.test = _ValueCalls().visit(node.test)
        return node

    def visit_Assign(self, node: ast.Assign | ast.AnnAssign):
        """A value bound to a name that decides a branch or an assert left as written (`_decisive`) reports its
        value, and its calls theirs: `got = evaluate(x)` before `if got != -1: raise ValueError(got)` or
        `assert (v := got) == -1`, where an operator of whatever the package returned decided and no check
        reported it."""
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        bound = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if self.functions and node.value is not None and bound & self.decisive:
            value = _ValueCalls().visit(node.value)
            node.value = value if isinstance(value, ast.Call) and _name(value.func) == VALUE else _call(VALUE, value)
        return node

    visit_AnnAssign = visit_Assign

    def _bound(self, target: ast.expr | None) -> list[ast.stmt]:
        """`__value__(name)` for each name `target` binds (a loop's, a `with ... as`'s) that decides a branch or an
        assert left as written (`_decisive`): reported where it is bound, as an assignment's value is
        (`visit_Assign`)."""
        if not self.functions or target is None:
            return []
        names = sorted({n.id for n in ast.walk(target) if isinstance(n, ast.Name)} & self.decisive)
        return [ast.Expr(_call(VALUE, ast.Name(id=name, ctx=ast.Load()))) for name in names]

    def visit_ExceptHandler(self, node: ast.ExceptHandler):
        """`except E as error`, where `error` decides a branch or an assert left as written: its type and its
        arguments are reported where it is bound (an exception's value is its type alone, `pytest_runner._plain`,
        and what the code put in it decided)."""
        self.generic_visit(node)
        if node.name and self._bound(ast.Name(id=node.name, ctx=ast.Load())):
            error = ast.Name(id=node.name, ctx=ast.Load())
            node.body.insert(0, ast.Expr(_call(VALUE, ast.Tuple(elts=[error, ast.Attribute(
                value=error, attr="args", ctx=ast.Load())], ctx=ast.Load()))))
        return node

    def _observed(self, checks: list[tuple[ast.expr, str | None]], drafted: bool = True) -> list[ast.stmt]:
        """`__check__(lambda: check[, relation])` for each of `checks` (an expression and what it was checked by,
        `_checks`), with its drafts in a FAIL_TO_PASS test."""
        statements = []
        for check, relation in checks:
            group = [check, *_drafts(check, self.drafts if self.draft and drafted else 0, self.rng)]
            self.rng.shuffle(group)
            for expression in group:
                body = _ValueCalls().visit(_copy(expression))
                if isinstance(body, ast.Call) and _name(body.func) == VALUE:  # reported once, by `__check__`
                    body = body.args[0]
                lam = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[],
                                                    defaults=[]), body=body)
                report = _call(CHECK, lam, *([ast.Constant(relation)] if relation else []))
                setattr(report, _STEP, not drafted)
                statements.append(ast.Expr(report))
        return statements

    def visit_With(self, node: ast.With):
        """`with pytest.raises(E[, match=r]) [as info]: body` becomes a `try` per draft of the body that reports
        which exception, if any, ended it (and its message where the test matched one), with E and r gone; the
        body's calls report their values but let an exception through, which ends the block as in pytest; `info`
        is bound to what was raised (`__caught__`: pytest's ExceptionInfo), from the original body, which runs
        last, for the checks after the block."""
        if len(node.items) != 1 or not _is_raises(node.items[0]):
            for item in node.items:  # `with pytest.warns(W):` reports the warnings its body gave (`__warned__`)
                item.context_expr = _warns_block(item) or item.context_expr
            self.generic_visit(node)
            node.body[:0] = [s for item in node.items if item.optional_vars for s in self._bound(item.optional_vars)]
            return node
        item, error = node.items[0], "__grading_error__"
        raises = item.context_expr
        message = any(k.arg == "match" for k in raises.keywords) or _name(raises.func).endswith(("Regex", "Regexp"))
        drafts = _drafts(ast.Module(body=node.body, type_ignores=[]), self.drafts if self.draft else 0, self.rng)
        self.rng.shuffle(drafts)
        out, outer, self.raising = [], self.raising, True
        for body in [*drafts, node.body]:
            body = body.body if isinstance(body, ast.Module) else body
            body = [s for statement in body for s in _listed(self.visit(statement))]
            caught = [ast.Expr(_call(RAISED, ast.Name(id=error, ctx=ast.Load()), ast.Constant(message)))]
            missed = [ast.Expr(_call(RAISED, ast.Constant(None)))]
            if item.optional_vars is not None:
                caught.append(ast.Assign(targets=[item.optional_vars], value=_call(
                    CAUGHT, ast.Name(id=error, ctx=ast.Load()))))
                missed.append(ast.Assign(targets=[item.optional_vars], value=ast.Constant(None)))
            out.append(ast.Try(
                body=body,
                handlers=[ast.ExceptHandler(type=ast.Name(id="BaseException", ctx=ast.Load()), name=error,
                                            body=caught)],
                orelse=missed, finalbody=[]))
        self.raising = outer
        return out


class _Columns:
    """A `pytest.mark.parametrize("a, expected", [(1, 2), ...])` decorator whose values are literals (of any kind:
    lists, tuples, dicts, negative numbers, None), written in it or bound to a name (`_tables`, inlined here), with
    no keyword but `ids=` a list of strs: `data` its argument names; `drop(names)` replaces those columns' values by
    None and, where the test gave no `ids=`, writes out the test ids pytest made from the original values, so that
    the node ids stay and the expected values go."""

    def __init__(self, call: ast.Call, names: list[str], rows: list[list[ast.expr]]):
        self.call, self.names, self.rows = call, names, rows
        self.data = names

    @classmethod
    def of(cls, decorator: ast.expr, tables: dict[str, ast.expr]):
        if not (isinstance(decorator, ast.Call) and _name(decorator.func).endswith("mark.parametrize")
                and len(decorator.args) == 2 and all(k.arg == "ids" for k in decorator.keywords)):
            return None
        spec, values = decorator.args
        if isinstance(spec, ast.Constant) and isinstance(spec.value, str):
            names = [n.strip() for n in spec.value.split(",") if n.strip()]
        elif isinstance(spec, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) for e in spec.elts):
            names = [e.value for e in spec.elts]
        else:
            return None
        if isinstance(values, ast.Name) and values.id in tables:  # `CASES = [...]` then `parametrize(..., CASES)`
            values = decorator.args[1] = copy.deepcopy(tables[values.id])
        if not isinstance(values, (ast.List, ast.Tuple)) or not values.elts:
            return None
        rows = [row.elts if len(names) > 1 and isinstance(row, (ast.Tuple, ast.List)) else [row]
                for row in values.elts]
        ids = [k.value for k in decorator.keywords]
        if not all(len(row) == len(names) and all(_is_literal(v) and not _has_bytes(v) for v in row)
                   for row in rows) or ids and not (_is_literal(ids[0]) and all(
                isinstance(i, str) for i in ast.literal_eval(ids[0])) and len(ast.literal_eval(ids[0])) == len(rows)):
            return None  # ids pytest would make otherwise are not written out here: left as it is
        return cls(decorator, names, rows)

    def drop(self, names: set[str]) -> None:
        if not names:
            return
        ids = ["-".join(_test_id(ast.literal_eval(v), name, index) for name, v in zip(self.names, row))
               for index, row in enumerate(self.rows)]
        values = [[ast.Constant(None) if name in names else v for name, v in zip(self.names, row)]
                  for row in self.rows]
        self.call.args[1] = ast.List(elts=[ast.Tuple(elts=row, ctx=ast.Load()) if len(row) > 1 else row[0]
                                           for row in values], ctx=ast.Load())
        if not self.call.keywords:  # the test's own `ids=` stay as they are
            self.call.keywords.append(ast.keyword(arg="ids", value=ast.List(elts=[ast.Constant(i) for i in ids],
                                                                              ctx=ast.Load())))


def _test_id(value, name: str, index: int) -> str:
    """The part of a test id pytest makes from a parametrize value (`_pytest.python.IdMaker._idval`): a str, a
    number, a bool or None by its str (escaped to ASCII as pytest escapes explicit ids too), any other literal
    (a list, a tuple, a dict) by the argument's name and the row's index (`tokens0`)."""
    if value is None or type(value) in (str, int, float, bool, complex):
        return str(value)
    return f"{name}{index}"


def _has_bytes(node: ast.expr) -> bool:
    """Whether a literal holds bytes (pytest writes their ids otherwise: not written out here)."""
    return any(isinstance(n, ast.Constant) and isinstance(n.value, bytes) for n in ast.walk(node))


class _Table:
    """A `for a, b in [(1, 2), ...]` loop over a literal table (`names` its target's names, `table` the list or
    tuple of its rows, each a literal per name); `drop(names)` replaces those columns' values by None."""

    def __init__(self, names: list[str], table: ast.List | ast.Tuple):
        self.names, self.table = names, table

    @classmethod
    def of(cls, loop: ast.For):
        target, table = loop.target, loop.iter
        single = isinstance(target, ast.Name)
        if single:
            names = [target.id]
        elif isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
            names = [e.id for e in target.elts]
        else:
            return None
        if len(set(names)) != len(names) or not isinstance(table, (ast.List, ast.Tuple)) or not table.elts:
            return None
        rows = [[row] if single else row.elts if isinstance(row, (ast.Tuple, ast.List)) else None
                for row in table.elts]
        if not all(row is not None and len(row) == len(names) and all(map(_is_literal, row)) for row in rows):
            return None
        return cls(names, table)

    def drop(self, names: set[str]) -> None:
        if names and len(self.names) == 1:
            self.table.elts = [ast.Constant(None) for _ in self.table.elts]
        elif names:
            for row in self.table.elts:
                row.elts = [ast.Constant(None) if name in names else v for name, v in zip(self.names, row.elts)]


def _listed(result) -> list:
    return result if isinstance(result, list) else [result]


def function_name(nodeid: str) -> str:
    """`path::Class::f[param]` -> `Class::f`: the function a node id runs, without its parameters."""
    return nodeid.split("::", 1)[1].split("[", 1)[0] if "::" in nodeid else ""


def observe(source: str, rng: random.Random, drafted: set[str], drafts: int = 3) -> str:
    """`source` (a test module) in observation form (see the module docstring), or unchanged when it does not
    parse (its tests then fail in both runs alike). Only the checks of the tests `drafted` (`f` or `Class::f`: the
    FAIL_TO_PASS ones) get drafts: a PASS_TO_PASS test checks what worked before the fix, so its inputs stay."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    tree.body = [s for s in _docstring_free(tree.body)]
    names = _data_names(tree)
    tables = _tables(tree, names)
    tree = _Inlined(tables).visit(tree)
    tree = _Observe(rng, drafts, drafted, names, _fixtures(tree), tables, _assigned(tree)).visit(tree)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    tree = ast.fix_missing_locations(_DeadData(set(names) - read).visit(tree))
    return ast.unparse(tree) + "\n"
