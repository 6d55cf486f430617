"""SWE-Gym action format, diff helpers, truncation and the shipped task rows: pure functions, no sandbox."""

import pytest

from trl_multiturn.envs.swegym.actions import (
    ActionParseError,
    Bash,
    Create,
    Replace,
    Submit,
    View,
    format_action,
    parse_action,
)
from trl_multiturn.envs.swegym.patches import make_patch, patch_paths, patch_to_actions
from trl_multiturn.envs.swegym.sandbox import truncate_middle
from trl_multiturn.envs.swegym.tasks import TASK_NAMES, load_tasks, task_sources
from trl_multiturn.envs.swegym.tasks.source import apply_edits

ACTIONS = [
    Bash("python -m pytest -q tests | tail -3"),
    View("pkg/mod.py"),
    View("pkg/mod.py", 10, 40),
    View("pkg/mod.py", 10, None),
    Replace("pkg/mod.py", "    return a - b", "    return a + b"),
    Replace("pkg/mod.py", "line one\nline two\n", ""),
    Replace("pkg/mod.py", "\nleading newline kept", "x\n"),
    Create("pkg/new.py", "print('hi')\n"),
    Create("empty.txt", ""),
    Submit(),
]


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: type(a).__name__)
def test_format_then_parse_round_trips(action):
    reply = f"Let me think about this first.\n{format_action(action)}\nAnything after the tag is ignored."
    assert parse_action(reply) == action


def test_first_action_wins_and_forms_are_equivalent():
    reply = '<view path="a.py" lines="3"/> then <bash>rm -rf /</bash>'
    assert parse_action(reply) == View("a.py", 3, 3)
    inline = parse_action('<replace path="a.py"><old>x = 1</old><new>x = 2</new></replace>')
    block = parse_action('<replace path="a.py">\n<old>\nx = 1\n</old>\n<new>\nx = 2\n</new>\n</replace>')
    assert inline == block == Replace("a.py", "x = 1", "x = 2")
    assert parse_action("<SUBMIT>") == Submit()
    assert parse_action('<create path="b.py">\nx = 1</create>') == Create("b.py", "x = 1\n")


@pytest.mark.parametrize(
    "reply, says",
    [
        ("I would fix the bug by editing core.py", "no action found"),
        ("<bash>ls -la", "not closed"),
        ("<bash>   </bash>", "empty"),
        ('<view lines="1-5"/>', "path attribute"),
        ('<view path="a.py" lines="ten"/>', "not a range"),
        ('<replace path="a.py"><old>x</old></replace>', "<new>"),
        ('<replace path="a.py"><old></old><new>y</new></replace>', "empty"),
        ('<create path="a.py"/>', "needs a body"),
    ],
)
def test_malformed_replies_raise_a_helpful_error(reply, says):
    with pytest.raises(ActionParseError, match=says):
        parse_action(reply)


def test_truncate_middle_keeps_head_and_tail_within_budget():
    text = "".join(f"line {i}\n" for i in range(10_000))
    out = truncate_middle(text, 1000)
    assert out.startswith("line 0\n") and out.endswith("line 9999\n")
    omitted = len(text) - 1000
    assert f"[... {omitted} characters truncated ...]" in out
    assert len(out) < 1000 + 60
    assert truncate_middle("short", 1000) == "short"


def test_make_patch_and_patch_paths():
    before = {"a.py": "x = 1\ny = 2\n", "gone.py": "old\n"}
    after = {"a.py": "x = 1\ny = 3\n", "new.py": "z = 0\n"}
    patch = make_patch(before, after)
    assert patch_paths(patch) == ["a.py", "gone.py", "new.py"]
    assert "-y = 2\n+y = 3\n" in patch and "new file mode 100644" in patch and "deleted file mode" in patch


def _apply_actions(files: dict[str, str], actions) -> dict[str, str]:
    files = dict(files)
    for action in actions:
        if isinstance(action, Replace):
            assert files[action.path].count(action.old) == 1, action
            files[action.path] = files[action.path].replace(action.old, action.new)
        elif isinstance(action, Create):
            files[action.path] = action.content
        elif isinstance(action, Bash):
            assert action.command.startswith("rm -- ")
            del files[action.command.removeprefix("rm -- ")]
    return files


@pytest.mark.parametrize("source", task_sources(), ids=lambda s: s.name)
def test_gold_patch_as_edit_actions_reproduces_the_fix(source):
    base = source.files_at_base()
    actions = patch_to_actions(source.patch)
    assert isinstance(actions[0], View) and any(isinstance(a, Replace) for a in actions)
    assert _apply_actions(base, actions) == apply_edits(base, source.fix)


def test_patch_to_actions_handles_new_deleted_and_eof_without_newline():
    before = {"a.py": "one\ntwo", "gone.py": "bye\n"}
    after = {"a.py": "one\nTWO", "new.py": "hello\n"}
    actions = patch_to_actions(make_patch(before, after))
    assert _apply_actions(before, actions) == after


def test_shipped_task_rows_follow_the_swebench_schema():
    tasks = load_tasks()
    assert len(tasks) == len(TASK_NAMES) >= 12
    columns = {"instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "hints_text",
               "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit"}
    assert columns <= set(tasks.column_names)
    assert len(set(tasks["instance_id"])) == len(tasks)
    for row in tasks:
        assert len(row["base_commit"]) == 40 and row["instance_id"].startswith("trl-multiturn__")
        assert row["FAIL_TO_PASS"] and row["PASS_TO_PASS"]
        assert not set(row["FAIL_TO_PASS"]) & set(row["PASS_TO_PASS"])
        test_files = patch_paths(row["test_patch"])
        assert test_files and all(path.startswith("tests/") for path in test_files)
        assert not set(patch_paths(row["patch"])) & set(test_files), "the gold patch must not touch the tests"
        assert all(t.split("::")[0] in test_files for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"])
