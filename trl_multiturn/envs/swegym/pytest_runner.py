"""Run pytest for SWE-Gym grading and send each test's outcome to the host as it happens.

    python -s pytest_runner.py TOKEN_PATH REPORT_FD AUDIT_PATH PYTEST_ARGS...

Grading copies this file into the sandbox and runs it in place of `python -m pytest`; it imports nothing of
trl_multiturn but `variation.py` (standard library only), copied beside it. Each record is one line `TOKEN JSON`
written to the descriptor REPORT_FD, the sandbox's channel (`Sandbox.run(..., channel=True)`: a pipe the host
reads while the tests run, or the exec's stream in Docker), so a record, once written, is the host's: nothing in
the sandbox can take it back, truncate or replace it. Records:
`{"test": nodeid, "status": S}` with S as pytest's short summary names it (PASSED, FAILED, ERROR, SKIPPED, XFAIL,
XPASS), `{"audit": event, "where": "path:line", "what": detail}` for each way the patch's code looked into the test
process (below), and a last `{"exit": code}` once pytest returns (the host counts anything after it as forged,
but audit records of code the patch runs at exit). The
token is read from TOKEN_PATH, which is deleted before pytest (and so any of the agent's code) starts: it is in no
file, argument or environment variable the tests can read. pytest is imported before the working folder goes on
sys.path, so no module of the repository can stand in for it. Grading reads nothing else the test run prints or
writes.

**The audit hook** (PEP 578; Python offers no way to remove one): AUDIT_PATH (deleted before pytest starts) holds
the lines the patch added, `{"added": {path: [[first, last], ...]}, "known": [Python files of the base commit, the
clean checkout and the test patch], "tests": [test files]}`. The hook is installed before pytest and the
repository are importable, and records an audited event when the innermost frame of the repository on the stack is
on a line the patch added (frames of the standard library and site-packages are passed over: a call through
`inspect` or `traceback` is the caller's; code the patch compiled or exec'd, and a Python file of the repository
that is not known, count as added;
files are compared by real path, so a symbolic link to a module is the module):

- frames and code: `sys._getframe`, `sys._current_frames`, `sys._current_exceptions`, and reading `f_code`,
  `tb_frame`, `gi_frame`/`cr_frame`/`ag_frame`, their `*_code`, and the `__code__` of a function of a test file or of
  pytest (the package's own functions are its business);
- object scans and tracing: `gc.get_objects`/`get_referrers`/`get_referents`, `sys.settrace`/`setprofile`, a new
  audit hook, code or function objects made by hand (a frame's file name can then lie);
- the test runner's internals: importing `_pytest`, `pluggy` or `ctypes` (seen when the import loads the module:
  pytest's are loaded before the package is); any `ctypes` call;
- ways out of the process that a second run could read: starting a process (its Python has no hook), binding or
  connecting a socket to an abstract Unix address or the loopback;
- reads of the hidden tests' files, of `/proc/<pid>` and of grading's scratch folder.

Some standard functions use frames for their own bookkeeping and hand none to their caller (`namedtuple`, `enum`,
`typing`, `dataclasses`, `warnings`, `logging`, `inspect.signature`, formatting a caught exception with
`traceback`): an event under them is not recorded. An event in a thread the tests' process started, with no frame
of the repository on its stack (a standard function run by an executor), is recorded too. The runner also leaves
`PYTEST_CURRENT_TEST` unset and empties `linecache` before each test (pytest fills it with a test file's text when
it reports a failure), so which test runs is not written where the tests' process can read it unaudited.

**Observations**: `__check__(thunk[, relation])`, `__value__(value)`, `__raised__(error, message)`,
`__caught__(error)`, `__warned__(message)` and `__varied__(value, seed)` (a draft's input changed when the test
runs: `variation.varied`) are put in `builtins`; the observation form of the tests
(`observe.py`) calls them to report each value a check looks at, as plain data (`_plain`, whole: no item or level
is cut), what `bool` answers for a bare truth, the warnings a `pytest.warns` block gave, and a *blind* mark for a
check nothing reported can decide (`_Observations`). Per test, one record `{"values": nodeid, "count": n,
"digest": sha256, "blind": k}` follows its outcome. Nothing here is trusted: grading compares the digests with
those of the gold patch's run, made in another sandbox, and the expected values are in no file, frame or record of
this process. The audit hook and the token are signals.
"""

import builtins
import hashlib
import json
import os
import sys
import types

from _pytest.recwarn import WarningsRecorder

try:
    from .variation import varied  # imported as a module of trl_multiturn (its tests)
except ImportError:  # the sandbox's copy, run as a script: grading copies variation.py beside it
    from variation import varied

# Standard functions that use frames or code for their own bookkeeping: (file name ending, function names).
_BOOKKEEPING = [
    ("/collections/__init__.py", {"namedtuple"}), ("/enum.py", None), ("/typing.py", None),
    ("/dataclasses.py", None), ("/abc.py", None), ("/functools.py", None), ("/warnings.py", None),
    ("/logging/__init__.py", None), ("/asyncio/coroutines.py", None), ("/asyncio/format_helpers.py", None),
    ("/inspect.py", {"signature", "_signature_from_callable", "_signature_from_function", "getfullargspec",
                     "_has_code_flag", "isgeneratorfunction", "iscoroutinefunction", "isasyncgenfunction"}),
    ("/traceback.py", {"format_exc", "print_exc", "format_exception", "print_exception", "extract_tb", "format_tb",
                       "print_tb", "walk_tb", "_extract_from_extended_frame_gen", "_walk_tb_with_full_positions",
                       "__init__", "_extract_caret_anchors_from_line_segment"}),
]
_FRAME_ATTRIBUTES = {"f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame", "gi_code", "cr_code", "ag_code"}
_ALWAYS = {"sys._getframe", "sys._current_frames", "sys._current_exceptions", "gc.get_objects", "gc.get_referrers",
           "gc.get_referents", "sys.settrace", "sys.setprofile", "sys.addaudithook", "code.__new__",
           "function.__new__", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "pty.spawn"}
_RUNNER_MODULES = ("_pytest", "pluggy", "ctypes", "_ctypes")
_LIMIT = 20  # audit records per run: enough to judge, too few to flood the report


_MAX_DEPTH = 100  # levels of a value; deeper, the check is unreportable (fail closed), never cut
# The operators a check decides by: when the check's expected side was dropped (a literal) and the object compared
# has one of these of the repository's own code, the package's operator would decide what the host never sees.
_RELATIONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")


class _Unreportable(Exception):
    """A value `_plain` cannot write whole (deeper than `_MAX_DEPTH`): its check reports a blind mark instead."""


def _plain(value, depth: int = 0, seen: frozenset = frozenset(), met: set | None = None):
    """`value` as plain JSON data: what grading compares with the gold patch's run (never a pickle). Numbers that
    are whole are ints and floats keep 12 significant digits (4.0 and 4 are the same answer, as `==` says); a
    tuple, set and dict say what they are (a set and a dict in a fixed order); an exception is its type; another
    object is its class's name and its attributes' values (its `__dict__` and `__slots__`), and for a C type
    (`date`, `Decimal`, `deque`, `complex`, a numpy array) what pickling rebuilds it from; a function or class
    its name; a value met again inside itself (a cycle) `{"cut": type}`. Every item is written, however many;
    a value deeper than `_MAX_DEPTH` levels raises `_Unreportable`. `met` collects the classes of the objects
    written this way (whose operators may be the package's: `_Observations.check`)."""
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind in (int, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"float": repr(value)}
        if kind is float and value.is_integer() and abs(value) < 2 ** 53:
            return int(value)
        return float(f"{value:.12g}") if kind is float else value
    if kind is bytes:
        return {"bytes": value.hex()}
    if id(value) in seen:
        return {"cut": kind.__qualname__}
    if depth > _MAX_DEPTH:
        raise _Unreportable(f"a value deeper than {_MAX_DEPTH} levels")
    inner = seen | {id(value)}

    def each(items):
        return [_plain(item, depth + 1, inner, met) for item in list(items)]

    if kind is list:
        return each(value)
    if kind is tuple:
        return {"tuple": each(value)}
    if kind in (set, frozenset):
        return {"set": sorted(each(value), key=lambda item: json.dumps(item, sort_keys=True))}
    if kind is dict:
        pairs = [[_plain(k, depth + 1, inner, met), _plain(v, depth + 1, inner, met)] for k, v in list(value.items())]
        return {"dict": sorted(pairs, key=lambda pair: json.dumps(pair[0], sort_keys=True))}
    if isinstance(value, BaseException):
        return {"raised": kind.__qualname__}
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)):
        return {"name": getattr(value, "__qualname__", getattr(value, "__name__", "?"))}
    if met is not None:
        met.add(kind)
    state = {}
    for name in [n for c in kind.__mro__ for n in getattr(c, "__slots__", ()) if isinstance(n, str)]:
        if name not in ("__dict__", "__weakref__") and hasattr(value, name):
            state[name] = getattr(value, name)
    state.update(getattr(value, "__dict__", None) or {})
    base = next((b for b in kind.__mro__ if b in (int, float, str, bytes, list, tuple, dict, set, frozenset)), None)
    plain = {"type": kind.__qualname__, "state": _plain(state, depth + 1, inner, met)}
    if base is not None:  # a subclass of a builtin: its builtin value too
        plain["value"] = _plain(base(value), depth + 1, inner, met)
    elif not state or any(not c.__flags__ & _HEAP_TYPE for c in kind.__mro__[:-1]):
        plain["reduced"] = _reduced(value, depth, inner, met)  # a C type keeps its value out of both
    return plain


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time (a class statement, or a module's spec)


def _reduced(value, depth: int, inner: frozenset, met: set | None):
    """What pickling would rebuild `value` from (`__reduce_ex__`: the arguments, state and items past its
    constructor): the value of a C type (`datetime.date`, `Decimal`, `deque`, a numpy array), which neither
    `__dict__` nor `__slots__` holds. None where it cannot be pickled."""
    try:
        reduced = value.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 - a lock, a file: reported by its type alone, as before
        return None
    if isinstance(reduced, str):  # a module-level object, by name
        return reduced
    parts = [list(part) if hasattr(part, "__next__") else part for part in reduced[1:]]
    return _plain(parts, depth + 1, inner, met)


class _Observations:
    """What `__check__`, `__value__`, `__raised__` and `__warned__` (the builtins the observation form of
    `observe.py` calls) report: per test, the number of values, a sha256 over their canonical JSON, and how many
    checks were blind (below), written as one record when the test ends. The values themselves stay here: grading
    compares the digests with the gold patch's run.

    A check is *blind* where what decides it cannot be reported: its value is deeper than `_MAX_DEPTH`, or the
    observation form dropped the written value it compared with (`check(thunk, "compared")`) and the object has an
    operator of `_RELATIONS` written in the repository (under `root`), which would have decided against the
    literal, so reporting the object's state would not say what the package's operator answers. The host fails
    a test whose gold run had a blind check (`integrity.judge_values`): nothing it can compare decides it."""

    def __init__(self, root: str | None = None):
        self.root = os.path.join(os.path.realpath(root or os.getcwd()), "")
        self.count, self.blind, self.digest = 0, 0, hashlib.sha256()

    def add(self, plain) -> None:
        self.count += 1
        scalar = type(plain) in (int, float, str, bool, type(None))  # repr: canonical for these, and faster
        self.digest.update((repr(plain) if scalar else json.dumps(plain, sort_keys=True)).encode() + b"\n")

    def _report(self, value, relation: str | None = None) -> None:
        met: set = set()
        try:
            self.add(_plain(value, met=met))
        except (_Unreportable, RecursionError) as error:
            self._blind(str(error) or "a value too deep to write")
            return
        if relation == "truth":  # `assert c`, `assert not c`: what `bool` answers decides (`__bool__`, `__len__`)
            try:
                self.add({"truth": bool(value)})
            except Exception as error:  # noqa: BLE001 - what `bool` raised is the answer (a numpy array's)
                self.add({"truth": {"raised": type(error).__qualname__}})
        elif relation is not None:
            own = sorted(f"{k.__qualname__}.{name}" for k in met for name in _RELATIONS if self._own(k, name))
            if own:
                self._blind(f"compared with a written value by {', '.join(own)}")

    def _own(self, kind: type, name: str) -> bool:
        """Whether `kind`'s operator `name` is Python code of the repository (the package's, or the patch's)."""
        code = getattr(getattr(kind, name, None), "__code__", None)
        filename = getattr(code, "co_filename", "")  # "<string>": made at run time (a dataclass's `__eq__`)
        return filename.startswith("/") and os.path.realpath(filename).startswith(self.root)

    def _blind(self, why: str) -> None:
        self.blind += 1
        self.add({"blind": why})

    def check(self, thunk, relation: str | None = None):
        """Report what `thunk()` returns, or raises; `relation` is how the check decided (`observe._checks`):
        "compared" where the observation form dropped a written value it was compared with, "truth" for a bare
        truth, else None."""
        try:
            value = thunk()
        except BaseException as error:  # noqa: B036 - the exception is the value (pytest's own ones too)
            self.add({"raised": type(error).__qualname__})
            return
        self._report(value, relation)

    def value(self, value):
        self._report(value)
        return value

    def raised(self, error, message: bool = False) -> None:
        """What ended a `pytest.raises` block: the exception's type (None: nothing), and its message where the test
        matched one (`message`)."""
        if error is None:
            self.add({"raised": None})
        else:
            self.add({"raised": type(error).__qualname__, **({"message": str(error)} if message else {})})

    def warned(self, message: bool = False) -> "_Warned":
        """`with pytest.warns(W)` / `deprecated_call()` / `assertWarns(W)` in observation form (see `_Warned`)."""
        return _Warned(self, message)

    def take(self) -> dict:
        record = {"count": self.count, "digest": self.digest.hexdigest(), "blind": self.blind}
        self.count, self.blind, self.digest = 0, 0, hashlib.sha256()
        return record


class _Warned(WarningsRecorder):
    """A context that records every warning its body gives (pytest's `WarningsRecorder`, the class pytest.warns
    builds on, taken when this file is imported, before any of the patch's code runs; `as record` binds it) and
    reports, on the way out, each one's category and, where the test matched one, its message (not a
    ResourceWarning: when the garbage collector gives one differs between runs). W and the pattern are gone from
    the text, as a raises block's exception is; an exception from the body goes on through."""

    def __init__(self, observations: _Observations, message: bool):
        super().__init__(_ispytest=True)
        self.observations, self.message = observations, message

    def __exit__(self, *exc_info):
        super().__exit__(*exc_info)
        self.observations.add({"warned": [[w.category.__qualname__, str(w.message) if self.message else None]
                                          for w in self.list if not issubclass(w.category, ResourceWarning)]})


class _Audit:
    """The audit hook (see the module docstring); `record(event, where, what)` writes a signed record."""

    def __init__(self, watch: dict, scratch: str, record):
        root = os.path.realpath(os.getcwd())
        self.added = {os.path.join(root, path): [tuple(span) for span in spans]
                      for path, spans in watch.get("added", {}).items()}
        self.tests = {os.path.join(root, path) for path in watch.get("tests", [])}
        self.known = {os.path.join(root, path) for path in watch.get("known", [])} | self.tests
        self.root, self.scratch, self.record = root + os.sep, scratch.rstrip("/") + "/", record
        self.tainted: set[str] = set()
        self.real: dict[str, str] = {}
        self.busy: set[int] = set()
        self.seen: set = set()
        import _thread
        import threading
        self.ident, self.main = _thread.get_ident, threading.main_thread().ident

    def __call__(self, event, args):
        if event == "object.__getattr__":
            if args[1] not in _FRAME_ATTRIBUTES and args[1] != "__code__":
                return
        elif event == "open":
            if not isinstance(args[0], (str, bytes)):
                return
        elif event == "import":
            if not str(args[0]).startswith(_RUNNER_MODULES):
                return
        elif event in ("socket.bind", "socket.connect"):
            if not _local_address(args[1]):
                return
        elif event in ("compile", "exec"):
            pass
        elif event not in _ALWAYS and not event.startswith("ctypes."):
            return
        me = self.ident()
        if me in self.busy:
            return
        self.busy.add(me)
        try:
            self._judge(event, args, me)
        finally:
            self.busy.discard(me)

    def _judge(self, event, args, me):
        caller = sys._getframe(2)  # the frame that called the audited function
        if event in ("compile", "exec"):  # what added code compiles or runs itself counts as added (not imports)
            name = args[1] if event == "compile" else getattr(args[0], "co_filename", None)
            if isinstance(name, str) and name not in self.added and self._is_added(caller):
                self.tainted.add(name)
            return
        where = self._attribute(caller, me)
        if where is None:
            return
        what = args[1] if event == "object.__getattr__" else ""
        if event == "object.__getattr__" and what == "__code__":
            filename = self._resolved(getattr(getattr(args[0], "__code__", None), "co_filename", ""))
            if filename.startswith(self.root) and filename not in self.tests:
                return  # the package's own functions
            what = f"__code__ of {getattr(args[0], '__qualname__', '?')}"
        if event == "open":
            path = os.path.realpath(os.fsdecode(args[0]))
            if not (path in self.tests or path.startswith(self.scratch) or _is_process_file(path)):
                return
            what = path
        if event == "import":
            what = str(args[0])
        key = (event, where)
        if key not in self.seen and len(self.seen) < _LIMIT:
            self.seen.add(key)
            self.record({"audit": event, "where": where, "what": str(what)[:200]})

    def _attribute(self, frame, me) -> str | None:
        """`path:line` of the added line responsible for the event, or None when nothing the patch added is."""
        while frame is not None:
            code = frame.f_code
            filename = self._resolved(code.co_filename)
            if self._is_added(frame):
                return f"{filename.removeprefix(self.root)}:{frame.f_lineno}"
            if filename.startswith(self.root):
                return None
            for ending, names in _BOOKKEEPING:
                if filename.endswith(ending) and (names is None or code.co_name in names):
                    return None
            frame = frame.f_back
        return None if me == self.main else "a thread with no frame of the repository"

    def _resolved(self, filename: str) -> str:
        """The real path of a code object's file (a symbolic link to a module is the module), cached."""
        if filename not in self.real:
            self.real[filename] = os.path.realpath(filename) if filename.startswith("/") else filename
        return self.real[filename]

    def _is_added(self, frame) -> bool:
        """Whether `frame` runs a line the patch added: in its added spans, in a file of the repository that was
        not there at the base commit (one the patch made, or one its code wrote while the tests ran), or in code
        the added lines compiled."""
        filename = frame.f_code.co_filename
        if filename in self.tainted:
            return True
        filename = self._resolved(filename)
        if not filename.startswith(self.root):
            return filename in self.tainted
        spans = self.added.get(filename)
        if spans is None:
            return filename not in self.known
        return any(a <= frame.f_lineno <= b for a, b in spans)


def _local_address(address) -> bool:
    if isinstance(address, (bytes, str)):  # AF_UNIX: an abstract name starts with a NUL byte
        return address[:1] in (b"\0", "\0")
    host = address[0] if isinstance(address, tuple) and address else ""
    return isinstance(host, str) and (host in ("", "localhost", "::1", "0.0.0.0", "::") or host.startswith("127."))


def _is_process_file(path: str) -> bool:
    parts = path.split("/")
    return len(parts) > 3 and parts[1] == "proc" and (parts[2].isdigit() or parts[2] in ("self", "thread-self"))


def _caught(error: BaseException):
    """What `with pytest.raises(E) as info` binds in the observation form: pytest's ExceptionInfo of `error` (the
    exception the block's code raised), also under `exception`, the name unittest's `assertRaises` gives it."""
    import pytest

    info = pytest.ExceptionInfo.from_exception(error)
    info.exception = error
    return info


def _read_and_delete(path: str) -> str:
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    return text


def _status(report):
    """The outcome pytest's `-rA` summary gives a test after this phase, or None if the phase adds nothing."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "XPASS" if xfail else "PASSED"
        if report.skipped:
            return "XFAIL" if xfail else "SKIPPED"
        return "FAILED"
    if report.failed:
        return "ERROR"
    if report.skipped:
        return "XFAIL" if xfail else "SKIPPED"
    return None


def main() -> int:
    token_path, report_fd, audit_path, *args = sys.argv[1:]
    token = _read_and_delete(token_path).strip()
    watch = json.loads(_read_and_delete(audit_path))
    fd = int(report_fd)
    os.set_inheritable(fd, False)  # the tests' child processes do not get it (they could only add to it)

    def write(record: dict) -> None:
        os.write(fd, f"{token} {json.dumps(record)}\n".encode())

    sys.addaudithook(_Audit(watch, os.path.dirname(os.path.abspath(token_path)), write))
    observations = _Observations()
    builtins.__check__, builtins.__value__ = observations.check, observations.value
    builtins.__raised__, builtins.__warned__ = observations.raised, observations.warned
    import linecache

    import _pytest.runner
    import pytest  # before the working folder is on sys.path: a `pytest.py` of the repository cannot stand in

    _pytest.runner._update_current_test_var = lambda item, when: None  # no PYTEST_CURRENT_TEST
    builtins.__caught__, builtins.__varied__ = _caught, varied
    sys.path[0] = os.getcwd()  # the working folder first, as `python -m pytest` has it (not this file's folder)

    class Recorder:
        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_setup(self, item):
            linecache.clearcache()
            observations.take()  # what ran between tests (collection, module set-up) is no test's

        def pytest_runtest_logreport(self, report):
            status = _status(report)
            if status is not None:
                write({"test": report.nodeid, "status": status})
            if report.when == "teardown":
                write({"values": report.nodeid, **observations.take()})

    code = int(pytest.main(args, plugins=[Recorder()]))
    write({"exit": code})
    return code


if __name__ == "__main__":
    sys.exit(main())
