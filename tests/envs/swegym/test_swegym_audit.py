"""The runner's audit hook (trl_multiturn/envs/swegym/pytest_runner.py): every way the patch's added lines look into
the test process is recorded, and the standard library's own bookkeeping, or introspection the base code already
did, is not. The runner alone, in a folder of its own (in grading it runs in a sandbox: test_swegym_attacks.py);
and the lines grading hands it as the patch's, whatever the patch says of them to git."""

from __future__ import annotations

from test_swegym_integrity import run_runner

from trl_multiturn.envs.swegym import SandboxConfig, make_sandbox, task_rows
from trl_multiturn.envs.swegym.grading import _Grading
from trl_multiturn.envs.swegym.patches import patch_paths

# Introspection the repository already had before the patch: never recorded, even when added lines call it.
BASE = '''import inspect
import sys


def caller_module():
    return sys._getframe(1).f_globals["__name__"]


def arity(callback):
    return len(inspect.signature(callback).parameters)
'''

# What a fix may well add: the standard library uses frames or code for its own bookkeeping here.
LEGIT = {
    "named_tuple": "from collections import namedtuple\n    return namedtuple('Point', 'x y')(1, 2).x",
    "signature_of_a_test_callback": "import inspect\n    return list(inspect.signature(callback).parameters)",
    "calls_the_base_helpers": "return caller_module(), arity(callback)",
    "formats_a_caught_error": "import traceback\n    try:\n        1 / 0\n    except ZeroDivisionError:\n"
                              "        return traceback.format_exc()",
    "warns_and_logs": "import logging, warnings\n    warnings.warn('deprecated', DeprecationWarning, stacklevel=2)\n"
                      "    logging.getLogger('pkg').warning('logged')\n    return 1",
    "dataclass_and_enum": "import dataclasses, enum, typing\n    E = enum.Enum('E', 'a b')\n"
                          "    D = dataclasses.make_dataclass('D', [('x', int)])\n"
                          "    N = typing.NamedTuple('N', [('y', int)])\n    return D(1).x + N(2).y + E.a.value",
}

# Ways to look into the test process, each one an attack class of the README's table uses.
ATTACKS = {
    "frame_of_the_test": "import sys\n    return sys._getframe(1).f_locals",
    "inspect_stack": "import inspect\n    return inspect.stack()[1].frame.f_locals",
    "frame_from_a_traceback": "try:\n        raise ValueError\n    except ValueError as e:\n"
                              "        return e.__traceback__.tb_frame.f_back.f_locals",
    "code_of_the_test": "import sys\n"
                        "    m = [m for n, m in list(sys.modules.items()) if n.endswith('test_hidden')][0]\n"
                        "    return m.test_code_of_the_test.__code__.co_consts",
    "gc_scan": "import gc\n    return len(gc.get_objects())",
    "reads_the_test_file": "return open('tests/test_hidden.py').read()",
    "frames_through_an_executor": "import sys, concurrent.futures\n"
                                  "    with concurrent.futures.ThreadPoolExecutor(1) as pool:\n"
                                  "        return pool.submit(sys._current_frames).result()",
    "exec_with_a_borrowed_file_name": "ns = {}\n    exec(compile('import sys\\ndef namedtuple():\\n    return "
                                      "sys._getframe(1)', '/usr/lib/python3.11/collections/__init__.py', "
                                      "'exec'), ns)\n    return ns['namedtuple']()",
    "trace": "import sys\n    sys.settrace(lambda *a: None)\n    sys.settrace(None)",
    "ctypes": "import ctypes\n    return ctypes.CDLL(None)",
    "child_process": "import subprocess\n    return subprocess.run(['true'])",
    "process_memory_map": "return open('/proc/self/maps').read()",
    "abstract_socket": "import socket\n    s = socket.socket(socket.AF_UNIX)\n    s.bind(b'\\0speedups')\n"
                       "    s.close()",
}


def test_the_audit_records_what_the_added_lines_do_to_look_into_the_test_process_and_nothing_else(tmp_path):
    added_text, spans = "", {}
    first = len(BASE.splitlines()) + 1
    for name, body in {**LEGIT, **ATTACKS}.items():
        function = f"\n\ndef {name}(callback=None):\n    {body}\n"
        start = first + len(added_text.splitlines())
        spans[name] = (start, start + len(function.splitlines()) - 1)
        added_text += function
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "core.py").write_text(BASE + added_text)
    (tmp_path / "tests").mkdir()
    tests = "from pkg import core\n\n\ndef callback(a, b):\n    return a + b\n" + "".join(
        f"\n\ndef test_{name}():\n    core.{name}(callback)\n" for name in {**LEGIT, **ATTACKS})
    (tmp_path / "tests" / "test_hidden.py").write_text(tests)
    report = run_runner(tmp_path, ["tests/test_hidden.py"], added={"pkg/core.py": [[first, 1 << 30]]},
                        known=["pkg/__init__.py", "pkg/core.py"])
    assert report.exit_code is not None and len(report.outcomes) == len(LEGIT) + len(ATTACKS)
    assert all(report.outcomes[f"tests/test_hidden.py::test_{name}"] == "PASSED" for name in LEGIT), report.outcomes
    recorded: dict[str, set] = {}
    for record in report.audits:
        path, line = record["where"].rsplit(":", 1) if ":" in record["where"] else ("", "0")
        owner = next((n for n, (a, b) in spans.items() if path == "pkg/core.py" and a <= int(line) <= b),
                     "exec_with_a_borrowed_file_name" if "/collections/" in path else record["where"])
        recorded.setdefault(owner, set()).add(record["audit"])
    assert set(recorded) - {"frames_through_an_executor", "a thread with no frame of the repository"} == \
        set(ATTACKS) - {"frames_through_an_executor"}, recorded
    assert "a thread with no frame of the repository" in recorded  # the executor's thread ran sys._current_frames
    assert not set(recorded) & set(LEGIT)


def test_without_added_lines_nothing_is_recorded(tmp_path):
    """The base code's own introspection, run by the tests, is the repository's business."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(BASE)
    (tmp_path / "test_base.py").write_text("import pkg\n\n\ndef test_a():\n    assert pkg.caller_module() == "
                                           "'test_base' and pkg.arity(lambda a: a) == 1\n")
    report = run_runner(tmp_path, ["test_base.py"], added={"pkg/other.py": [[1, 1 << 30]]},
                        known=["pkg/__init__.py"])
    assert report.outcomes == {"test_base.py::test_a": "PASSED"} and report.audits == []


def test_a_module_reached_through_a_link_or_written_while_the_tests_run_counts_as_added(tmp_path):
    """Evasions of the line attribution: the added module imported under another name (a symbolic link the patch
    adds), and a module the added code writes into the repository and imports while the tests run."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "core.py").write_text("import sys\n\n\ndef peek():\n    return sys._getframe(1)\n")
    (tmp_path / "alias").symlink_to(tmp_path / "pkg")
    (tmp_path / "pkg" / "writer.py").write_text(
        "import importlib, pathlib\n\n\ndef generate():\n"
        "    pathlib.Path(__file__).with_name('gen.py').write_text('import gc\\n\\n\\ndef scan():\\n"
        "    return len(gc.get_objects())\\n')\n    return importlib.import_module('pkg.gen').scan()\n")
    (tmp_path / "test_x.py").write_text("from alias import core\nfrom pkg import writer\n\n\ndef test_link():\n"
                                        "    core.peek()\n\n\ndef test_written():\n    writer.generate()\n")
    report = run_runner(tmp_path, ["test_x.py"], added={"pkg/core.py": [[5, 5]], "pkg/writer.py": [[4, 7]]},
                        known=["pkg/__init__.py", "pkg/core.py", "pkg/writer.py"])
    assert {(r["audit"], r["where"]) for r in report.audits} == {("sys._getframe", "pkg/core.py:5"),
                                                                ("gc.get_objects", "pkg/gen.py:5")}


def test_a_patchs_gitattributes_hides_none_of_its_added_lines_from_the_audit(swegym_cache_dir):
    """A patch that adds `.gitattributes` marking Python files binary (`-diff`), or re-encoding them, beside its
    code: grading's `git diff` still shows every added line, so the audit's scope is the same as without it (before:
    "Binary files differ", no hunk, no added line audited)."""
    row = next(row for row in task_rows() if row["repo"].endswith("/rpn"))
    attributes = "[attr]opaque -diff -text\n*.py -diff\n*.py opaque\n"
    lines = "".join(f"+{line}\n" for line in attributes.splitlines())
    patch = (f"diff --git a/.gitattributes b/.gitattributes\nnew file mode 100644\n--- /dev/null\n"
             f"+++ b/.gitattributes\n@@ -0,0 +1,{len(attributes.splitlines())} @@\n{lines}{row['patch']}")
    with make_sandbox(SandboxConfig(repo_cache_dir=swegym_cache_dir)) as sandbox:
        sandbox.start(row)
        steps = _Grading(sandbox, row)
        untracked = steps.isolate_git()
        assert steps.apply_patch(patch)[0]
        scope = steps.audit_scope(untracked)["added"]
        assert sandbox.run("rm .gitattributes").exit_code == 0
        assert steps.audit_scope(untracked)["added"] == scope  # the same lines without the file
    python = {path for path in patch_paths(row["patch"]) if path.endswith(".py")}
    assert python and set(scope) == python and all(scope.values())


def test_nothing_a_patch_writes_crashes_grading_or_hides_in_a_cut_listing(swegym_cache_dir):
    """Grading's own reading of the checkout, after the patch (the wave 11 review, F6 and F10):
    - an added line that reads like a diff header (`++ "`, `++ b/elsewhere.py`: git prints it `+++ ...`) is no header,
      so the audit's scope is the real files' lines (before: `_unquoted('"')` raised SyntaxError out of grading, a 0
      turned into no grade at will, and `++ b/x` moved the later hunks to another file);
    - a listing longer than a command's output (`max_output_bytes`, small here; many long paths around a root
      `conftest.py`) is read whole, so the protected file is still removed (before: it was in the part cut out)."""
    row = next(row for row in task_rows() if row["repo"].endswith("/rpn"))
    with make_sandbox(SandboxConfig(repo_cache_dir=swegym_cache_dir, max_output_bytes=4096)) as sandbox:
        sandbox.start(row)
        steps = _Grading(sandbox, row)
        untracked = steps.isolate_git()
        assert steps.apply_patch(row["patch"])[0]
        module = "rpn/__init__.py"
        text = sandbox.read_file(module)
        sandbox.write_file(module, text + '_NOTES = """\n++ "\n++ b/elsewhere.py\n"""\nLAST = 1\n')
        scope = steps.audit_scope(untracked)["added"]
        last = len(text.splitlines()) + 5
        assert "elsewhere.py" not in scope and any(first <= last <= end for first, end in scope[module]), scope
        padding = "".join(f"mkdir -p {letter * 120} && touch {letter * 120}/{'p' * 120}{i}; "
                          for letter in "ad" for i in range(40))
        assert sandbox.run(f"{padding}echo 'collect_ignore_glob = [\"*\"]' > conftest.py").exit_code == 0
        removed = steps.restore_protected(untracked, set(patch_paths(row["test_patch"])))
        assert "conftest.py" in removed
        assert sandbox.run("test -e conftest.py").exit_code == 1
