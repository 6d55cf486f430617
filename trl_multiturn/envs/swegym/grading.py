"""Grade a patch the way the SWE-bench harness does, in a clean checkout, so that the patch cannot steer it.

`grade_patch(task, patch, config)`:
1. starts a fresh sandbox at the task's base commit (a clean copy: nothing the agent did is there) and moves
   its `.git` into the scratch folder, where grading's own git commands use it: nothing the patch writes can
   reach the git configuration, hooks or index that grading relies on, and grading's git reads no attributes of the
   work tree (`NEUTRAL_ATTRIBUTES`), no system or global configuration and no hooks;
2. applies the patch with swebench's `GIT_APPLY_CMDS` in turn (git apply, 3-way, --reject, patch --fuzz=5),
   resetting the tree between attempts; if none works the log gets swebench's APPLY_PATCH_FAIL marker;
3. restores every file the patch may not touch (`integrity.protected_reason`: tests, pytest configuration,
   conftest.py, start-up hooks, package metadata) and removes those it added;
4. resets the test files to the base commit and applies `test_patch`, as swebench's eval script does, deletes
   both patches from the scratch folder, rewrites each test file in observation form (`observe.observe`: every
   check reports the values it looks at and holds no expected value, with drafts on changed inputs), and the
   other Python modules the test patch writes and the modules of the suite the tests import too
   (`helper_modules`, no drafts), then plants canary tests in each
   test file (`integrity.plant_canaries`);
5. runs the tests through `pytest_runner.py` (the row's `test_cmd` says which pytest options) and reads the
   outcomes from the runner's token-signed records only, which reach this process on the sandbox's channel as
   they are written (`Sandbox.run(..., channel=True)`: no file the sandbox's user could replace afterwards);
6. judges the run by its canaries (`integrity.judge`);
7. does 1-6 again in another fresh sandbox with the gold patch (the row's `patch`) and the same observation text,
   and trusts a pass of the patch's run only where its values are the gold run's (`integrity.judge_values`): the
   verdict and the expected values live in this process, which never imports the patch's code, and the patch's
   sandbox never holds them. The gold run is left out when the patch's run reported no test passing; a gold run
   that does not run properly (its patch does not apply, it times out) raises `SandboxError`: nothing to compare
   with is an infrastructure failure, never a 0;
8. grades the trusted outcomes of the row's tests in the real run with `swebench.harness.grading.get_eval_report`
   and its `parse_log_pytest` parser, from a log of the host's writing (`log_lines`: the row's test ids, swebench's
   statuses, nothing the report named).

Any step of grading's own that fails (the protected files cannot be restored, the test patch does not apply)
scores 0. Our repositories are not in swebench's repository map, so the test spec is built from the row itself
(`log_parser="parse_log_pytest"`, `eval_type="pass_and_fail"`) rather than looked up.
"""

from __future__ import annotations

import ast
import functools
import json
import random
import re
import secrets
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .integrity import (
    PASSING,
    is_unobserved,
    judge,
    judge_values,
    plant_canaries,
    protected_reason,
    read_report,
    test_files_of,
)
from .observe import function_name, observe
from .patches import patch_paths, written_paths
from .sandbox import CHANNEL_FD, Sandbox, SandboxConfig, SandboxError, make_sandbox, task_image, truncate_middle

DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider"
REWARD_MODES = ("resolved", "dense")
RUNNER = Path(__file__).with_name("pytest_runner.py")


def as_test_list(value: Any, name: str) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS come as lists (SWE-Gym) or as JSON-encoded strings (SWE-bench on the Hub)."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of test ids (or its JSON string), got {type(value).__name__}")
    return list(value)


def split_test_cmd(test_cmd: str) -> tuple[list[str], str, list[str]]:
    """`[NAME=value ...] pytest ARGS` or `[NAME=value ...] python -m pytest ARGS` as (assignments, python, args).

    Grading runs pytest through its own runner, so any other test command is refused.
    """
    words = shlex.split(test_cmd)
    assignments = []
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        assignments.append(words.pop(0))
    if words[:1] in (["pytest"], ["py.test"]):
        return assignments, "python", words[1:]
    if len(words) >= 3 and words[0].startswith("python") and words[1:3] == ["-m", "pytest"]:
        return assignments, words[0], words[3:]
    raise ValueError(
        f"test_cmd={test_cmd!r}: grading runs pytest through its own runner, so the test command must be "
        "`[NAME=value ...] pytest ARGS` or `[NAME=value ...] python -m pytest ARGS`"
    )


@dataclass
class Grade:
    """The verdict on one patch. `report` is swebench's report for the instance (with `tests_status`);
    `ignored_paths` the files of the patch grading put back; `problem` what was wrong with the test run;
    `unobserved` the tests whose values in the gold run cannot decide them (no value, or a blind check:
    `integrity.is_unobserved`), failed whatever the patch's run reported; `differ` the tests the patch's run
    reported passing whose values are not the gold run's (failed)."""

    resolved: bool
    patch_applied: bool
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    timed_out: bool = False
    report: dict = field(default_factory=dict)
    log: str = ""
    ignored_paths: list[str] = field(default_factory=list)
    problem: str = ""
    unobserved: list[str] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)

    def reward(self, mode: str = "resolved") -> float:
        """`resolved`: 1.0 if swebench resolves the instance, else 0.0.

        `dense`: f2p_passed / f2p_total when every PASS_TO_PASS test still passes, else 0.0 (a resolved
        instance scores 1.0; a task without FAIL_TO_PASS tests falls back to `resolved`).
        """
        if mode not in REWARD_MODES:
            raise ValueError(f"reward mode {mode!r}: choose one of {REWARD_MODES}")
        if mode == "resolved" or self.f2p_total == 0:
            return float(self.resolved)
        if not self.patch_applied or self.p2p_passed < self.p2p_total:
            return 0.0
        return self.f2p_passed / self.f2p_total

    def summary(self) -> str:
        if not self.report.get("patch_exists", True) or self.report.get("patch_is_None"):
            return "No changes were submitted."
        if self.timed_out:
            return "The tests timed out."
        if not self.patch_applied:
            return "The patch could not be applied."
        verdict = "resolved" if self.resolved else "not resolved"
        ignored = f" Changes to {len(self.ignored_paths)} test or configuration files were ignored." if (
            self.ignored_paths) else ""
        problem = f" The test run was not trusted ({self.problem.split(':')[0]})." if self.problem else ""
        return (
            f"Issue {verdict}: {self.f2p_passed}/{self.f2p_total} failing tests now pass, "
            f"{self.p2p_passed}/{self.p2p_total} previously passing tests still pass.{ignored}{problem}"
        )

    def info(self) -> dict[str, Any]:
        """A small JSON-friendly record for StepResult.info."""
        return {
            "resolved": self.resolved,
            "patch_applied": self.patch_applied,
            "f2p_passed": self.f2p_passed,
            "f2p_total": self.f2p_total,
            "p2p_passed": self.p2p_passed,
            "p2p_total": self.p2p_total,
            "tests_timed_out": self.timed_out,
            "ignored_paths": list(self.ignored_paths),
            "grading_problem": self.problem,
            "unobserved_tests": list(self.unobserved),
            "values_differ": list(self.differ),
        }


def run_script(workdir: str, assignments: list[str], python: str, scratch: str, args: list[str],
               files: list[str]) -> str:
    """The test run, in SWE-bench's eval-script shape (before `make_test_spec` adds the exit-code lines). Python's
    string hashing is seeded the same in every run (a row's own PYTHONHASHSEED wins): the order of a set of strings
    is then the same in the patch's run and the gold patch's, whose values grading compares."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    command = ["PYTHONHASHSEED=0", *assignments, python, "-s", f"{scratch}/pytest_runner.py", f"{scratch}/token",
               str(CHANNEL_FD), f"{scratch}/audit.json", *args, *files]
    return "\n".join([
        "#!/bin/bash", "set -uo pipefail", f"cd {shlex.quote(workdir)}", f"echo '{START_TEST_OUTPUT}'",
        " ".join(shlex.quote(w) for w in command), f"echo '{END_TEST_OUTPUT}'",
    ]) + "\n"


def make_spec(task: dict, script: str, config: SandboxConfig, f2p: list[str], p2p: list[str]):
    """swebench's TestSpec for a row outside its repository map: pytest log parser, pass-and-fail grading."""
    from swebench.harness.utils import make_test_spec

    return make_test_spec(
        {
            "instance_id": task["instance_id"],
            "image": task_image(task, config),
            "repo": task["repo"],
            "version": str(task.get("version", "")),
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p,
            "log_parser": "parse_log_pytest",
            "eval_type": "pass_and_fail",
            "eval_script": script,
        }
    )


# Every attribute git acts on when it diffs, applies or checks out, made unspecified for every path in the git folder's
# own `info/attributes`, which outranks every `.gitattributes` of the work tree: a patch's `.gitattributes` (`*.py
# -diff`, `binary`, a macro, `working-tree-encoding`, `eol`, `ident`) changes nothing grading's git prints or writes.
NEUTRAL_ATTRIBUTES = "* !text !eol !crlf !ident !filter !diff !merge !working-tree-encoding !whitespace\n"


class _Grading:
    """The steps of grading inside one sandbox; every git command uses the git folder kept in scratch, and reads no
    configuration, attributes or hooks but that folder's (`git` is a shell function that says so)."""

    def __init__(self, sandbox: Sandbox, task: dict):
        self.sandbox, self.task = sandbox, task
        scratch = shlex.quote(sandbox.scratch_dir)
        self.git_env = (
            f"export GIT_DIR={scratch}/git GIT_WORK_TREE=. GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "
            "GIT_ATTR_NOSYSTEM=1; unset GIT_EXTERNAL_DIFF GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT; "
            'git() { command git -c core.attributesFile=/dev/null -c core.hooksPath=/dev/null "$@"; }; '
        )
        self.base = shlex.quote(task["base_commit"])

    def run(self, command: str, **kwargs):
        return self.sandbox.run(self.git_env + command, **kwargs)

    def _paths(self, *commands: str) -> list[list[str]]:
        """The NUL-separated paths each of `commands` prints, from one sandbox command (each costs ~0.2 s in
        Docker). The lists are separated by a lone "/", which no relative path can be. They go to a scratch file
        read whole, never through the command's output, which is cut at `max_output_bytes`: a patch that adds
        enough long paths would otherwise hide a protected file, or an added line, in the part cut out. A listing
        over `max_file_mb` is a grade of 0."""
        out = shlex.quote(f"{self.sandbox.scratch_dir}/paths")
        listings = " && printf '\\0/\\0' && ".join(commands)
        result = self.run(f"{{ {listings}; }} > {out}; code=$?; wc -c < {out}; exit $code")
        if result.exit_code != 0:
            raise _TrustedStepFailed(f"{commands[-1]}: {result.output[-500:]}")
        listing = self.sandbox.read_scratch("paths")
        size = result.output.strip().rpartition("\n")[2]
        if listing is None or not size.isdigit() or int(size) > self.sandbox.config.max_file_mb * 1024 * 1024:
            raise _TrustedStepFailed(f"{commands[-1]}: a listing of {size} bytes, over max_file_mb or unread")
        return [[p for p in section.split("\0") if p] for section in listing.split("\0/\0")]

    def isolate_git(self) -> set[str]:
        """Move `.git` out of the checkout; returns the untracked files the clean checkout already has."""
        scratch = shlex.quote(self.sandbox.scratch_dir)
        return set(self._paths(
            f"rm -rf {scratch}/git && mv .git {scratch}/git && mkdir -p {scratch}/git/info && "
            f"printf %s {shlex.quote(NEUTRAL_ATTRIBUTES)} > {scratch}/git/info/attributes && git ls-files --others -z"
        )[0])

    def apply_patch(self, patch: str) -> tuple[bool, str]:
        """Apply `patch` as swebench's run_instance does; returns (applied, log text)."""
        from swebench.harness.constants import APPLY_PATCH_FAIL, APPLY_PATCH_PASS
        from swebench.harness.run_evaluation import GIT_APPLY_CMDS

        path = shlex.quote(self.sandbox.write_scratch("model.patch", patch))
        result = None
        for attempt, command in enumerate(GIT_APPLY_CMDS):
            if attempt:
                self.run("git checkout -- . ; git clean -fdq")
            result = self.run(f"{command} {path}")
            if result.exit_code == 0:
                return True, f"{APPLY_PATCH_PASS}:\n{result.output}"
        if self.run(f"git apply --check --reverse {path}").exit_code == 0:
            return True, f"{APPLY_PATCH_PASS}: verified already applied"
        return False, f"{APPLY_PATCH_FAIL}:\n{result.output if result else ''}"

    def restore_protected(self, untracked_before: set[str], test_files: set[str]) -> list[str]:
        """Put back every protected file the patch changed and remove every protected file it added."""
        changed, untracked, tracked = self._paths(
            f"git diff --name-only --no-ext-diff --no-textconv --no-renames -z {self.base}",
            "git ls-files --others -z", f"git ls-tree -r -z --name-only {self.base}",
        )
        added, tracked = [p for p in untracked if p not in untracked_before], set(tracked)
        restore = [p for p in changed if protected_reason(p, test_files) and p in tracked]
        remove = [p for p in [*changed, *added] if protected_reason(p, test_files) and p not in tracked]
        steps = [f"rm -rf -- {' '.join(shlex.quote(p) for p in remove)}"] if remove else []
        if restore:
            steps.append(f"git checkout -f {self.base} -- {' '.join(shlex.quote(p) for p in restore)}")
        for step in steps:
            result = self.run(step)
            if result.exit_code != 0:
                raise _TrustedStepFailed(f"restoring protected files: {result.output[-500:]}")
        return sorted(set(restore) | set(remove))

    def audit_scope(self, untracked_before: set[str]) -> dict[str, Any]:
        """What the runner's audit hook needs of the patch: `added`, the Python lines it added or changed, by file,
        as [first, last] spans of the patched file, and `known`, the Python files of the base commit, of the clean
        checkout and of the test patch (any other Python file of the repository counts as added: one the patch
        made, or one its code writes while the tests run)."""
        # every line of a hunk starts with an indicator of its own ('>' added, '<' removed), so only git's own
        # headers start with '+++ ' or '@@ ': an added line `++ "` is no file header (it once made this a crash)
        diff, tracked = self._paths(
            f"git diff -U0 --text --no-color --no-ext-diff --no-textconv --no-renames --output-indicator-new='>' "
            f"--output-indicator-old='<' {self.base} | grep -aE '^(\\+\\+\\+ |@@ )' || true",
            f"git ls-tree -r -z --name-only {self.base}")
        added: dict[str, list[list[int]]] = {}
        path = None
        for line in "".join(diff).splitlines():
            if line.startswith("+++ "):
                path = _unquoted(line[4:])
                path = path[2:] if path.startswith("b/") else None
            elif path and path.endswith(".py") and (hunk := _HUNK_NEW.match(line)):
                first, count = int(hunk.group(1)), int(hunk.group(2) or 1)
                if count:
                    added.setdefault(path, []).append([first, first + count - 1])
        known = {*tracked, *untracked_before, *patch_paths(self.task["test_patch"])}
        return {"added": added, "known": sorted(p for p in known if p.endswith(".py"))}

    def apply_test_patch(self) -> None:
        """Reset the test files to the base commit and apply the test patch, as swebench's eval script does."""
        files = [shlex.quote(f) for f in patch_paths(self.task["test_patch"])]
        restore = "; ".join(f"{{ git checkout -q {self.base} -- {f} 2>/dev/null || rm -f -- {f}; }}" for f in files)
        path = shlex.quote(self.sandbox.write_scratch("test.patch", self.task["test_patch"]))
        result = self.run(f"{restore + '; ' if restore else ''}git apply --verbose {path}")
        if result.exit_code != 0:
            raise _TrustedStepFailed(f"the test patch does not apply: {result.output[-500:]}")
        # the patches are no business of the test run: the hidden tests' text is only where pytest runs it
        scratch = shlex.quote(self.sandbox.scratch_dir)
        result = self.run(f"rm -f -- {scratch}/test.patch {scratch}/model.patch")
        if result.exit_code != 0:
            raise _TrustedStepFailed(f"removing the patches from scratch: {result.output[-500:]}")


_HUNK_NEW = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def _unquoted(path: str) -> str:
    """A path as git writes it in a diff header: as is, or C-quoted (`"b/a\\"b.py"`, octal escapes for bytes)."""
    if not path.startswith('"'):
        return path
    return ast.literal_eval("b" + path).decode("utf-8", "surrogateescape")


class _TrustedStepFailed(RuntimeError):
    """A step of grading's own failed after the patch applied: the run cannot be trusted and scores 0."""


@dataclass
class _Run:
    """One test run of grading: `outcomes` (canaries left out) and `values` (per test, the count and digest of
    the values its checks reported and how many checks were blind: `integrity.VALUE_KEYS`) as the run's report
    says, `log` what the agent may see."""

    applied: bool
    log: str = ""
    trusted_log: str = ""
    outcomes: dict[str, str] = field(default_factory=dict)
    values: dict[str, tuple] = field(default_factory=dict)
    problem: str = ""
    timed_out: bool = False
    ignored: list[str] = field(default_factory=list)
    step_failed: bool = False


def _test_run(task: dict, patch: str, config: SandboxConfig, files: list[str], test_cmd: tuple, f2p: list[str],
              eval_timeout: float, texts: dict[str, str]) -> _Run:
    """Steps 1-6 of the module docstring in a fresh sandbox. `texts` holds the observation form of each test file
    (`observe.observe`); a file it lacks is read here once the test patch is applied, rewritten, and added."""
    from swebench.harness.constants import TESTS_ERROR

    assignments, python, pytest_args = test_cmd
    run = _Run(applied=False)
    with make_sandbox(config) as sandbox:
        sandbox.start(task)
        steps = _Grading(sandbox, task)
        try:
            untracked = steps.isolate_git()
            run.applied, run.log = steps.apply_patch(patch)
            run.trusted_log = run.log.split(":", 1)[0]  # the marker alone: the rest is the patch's own text
            if not run.applied:
                return run
            run.ignored = steps.restore_protected(untracked, set(patch_paths(task["test_patch"])))
            audit = {**steps.audit_scope(untracked), "tests": files}
            steps.apply_test_patch()
            rng, read = random.Random(secrets.randbits(64)), functools.cache(sandbox.read_file)
            # the gold run writes the modules the first run chose (`texts`: the test files and those)
            helpers = [p for p in texts if p not in files] if texts else helper_modules(task, files, audit["known"],
                                                                                        read)
            canaries = []
            for path in files:
                if path not in texts:
                    drafted = {function_name(t) for t in f2p if t.split("::")[0] == path}
                    texts[path] = observe(read(path), rng, drafted)
                text, planted = plant_canaries(path, texts[path], rng)
                sandbox.write_file(path, text)
                canaries += planted
            for path in helpers:  # observed as the tests are, with no drafts or canaries
                texts[path] = texts.get(path) or observe(read(path), rng, set())
                sandbox.write_file(path, texts[path])
            token = secrets.token_hex(16)
            sandbox.write_scratch("pytest_runner.py", RUNNER.read_text())
            sandbox.write_scratch("variation.py", RUNNER.with_name("variation.py").read_text())
            sandbox.write_scratch("token", token)
            sandbox.write_scratch("audit.json", json.dumps(audit))
            script = run_script(sandbox.workdir, assignments, python, sandbox.scratch_dir, pytest_args, files)
            # the report is the channel's bytes, received as the tests ran; it ends with the command's processes
            result = sandbox.run(f"/bin/bash {shlex.quote(sandbox.write_scratch('eval.sh', script))}",
                                 timeout=eval_timeout, channel=True)
            run.log += "\n" + result.output
            report = read_report(result.channel.decode("utf-8", errors="replace"), token)
            run.outcomes, run.problem = judge(report, canaries)
            run.values, run.timed_out = report.values, result.timed_out
        except _TrustedStepFailed as e:
            run.problem, run.step_failed = str(e), True
            run.trusted_log += f"\n{TESTS_ERROR}: {e}"
            run.log += f"\n{e}"
    return run


def helper_modules(task: dict, files: list[str], known: list[str], read) -> list[str]:
    """The Python modules observed as the test files are (no drafts or canaries), besides the test files run: those
    the test patch writes, and the modules of the suite (`known`: the Python files of the base commit, the clean
    checkout and the test patch) under a test file's folder, that are the suite's by `integrity.protected_reason`
    (in a test folder, or a test module: never the package's code), that the tests import, directly or through
    another such module (by name: `from tests.helpers import check` and `import helpers` name `helpers`; a
    package's `__init__.py` by its folder's name); `read(path)` gives a file's text. Not a conftest.py (pytest's
    plugin). A check in one runs inside a test: as written, its assert was decided by whatever the package returned,
    and only the call's value was reported."""
    written = [path for path in written_paths(task["test_patch"])
               if path.endswith(".py") and path not in files and PurePosixPath(path).name != "conftest.py"]
    folders = {PurePosixPath(f).parent for f in files}
    suite = [path for path in known if path.endswith(".py") and path not in files and path not in written
             and PurePosixPath(path).name != "conftest.py" and protected_reason(path) in _SUITE
             and any(folder in PurePosixPath(path).parents for folder in folders)]
    imported = set().union(*(_imported(read(path)) for path in [*files, *written]))
    chosen: list[str] = []
    while found := [path for path in suite if path not in chosen and _module_name(path) in imported]:
        chosen += found
        imported |= set().union(*(_imported(read(path)) for path in found))
    return [*written, *chosen]


_SUITE = ("the test suite", "a test module")  # what `protected_reason` says of a module of the suite


def _module_name(path: str) -> str:
    """The name an import gives a module's file: `tests/helpers.py` -> `helpers`, `tests/util/__init__.py` ->
    `util`."""
    path = PurePosixPath(path)
    return path.parent.name if path.name == "__init__.py" else path.stem


def _imported(text: str) -> set[str]:
    """Every name an import of `text` holds (`import a.b` -> a, b; `from a.b import c` -> a, b, c), or none where
    it does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(part for alias in node.names for part in alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            names.update((node.module or "").split("."))
            names.update(alias.name for alias in node.names)
    return names


def _verdict(task: dict, real: _Run, config: SandboxConfig, files: list[str], test_cmd: tuple, f2p: list[str],
             tests: list[str], eval_timeout: float,
             texts: dict[str, str]) -> tuple[dict[str, str], str, str, list[str], list[str]]:
    """The outcomes of `real` that grading trusts (step 7 of the module docstring), the problem ("" if none), a
    line for the log, the tests the gold run's values cannot decide (`integrity.is_unobserved`), and the tests
    the patch's run reported passing whose values differ from the gold run's. The gold patch's run is left out
    when the patch's run reported no test passing (nothing to vouch for)."""
    if not any(real.outcomes.get(t) in PASSING for t in tests):
        return real.outcomes, real.problem, "", [], []
    gold = _test_run(task, task["patch"], config, files, test_cmd, f2p, eval_timeout, texts)
    if not gold.applied or gold.step_failed or gold.timed_out or gold.problem:
        why = gold.problem or ("timed out" if gold.timed_out else "the gold patch did not apply")
        # the values to compare with are missing: an infrastructure failure (or a bad row), never a grade of 0
        raise SandboxError(f"the gold patch's run did not run properly: {why}")
    trusted = judge_values(real.outcomes, real.values, gold.outcomes, gold.values, tests)
    claimed = [t for t in tests if real.outcomes.get(t) in PASSING]
    differ = [t for t in claimed if trusted[t] not in PASSING]
    line = (f"\n[the values of {len(claimed)} passing tests were compared with the gold patch's run, in a sandbox "
            f"of its own: {len(differ)} differ]")
    blind = [t for t in tests if is_unobserved(gold.values.get(t))]
    return {**real.outcomes, **trusted}, real.problem, line, blind, differ


def log_lines(outcomes: dict[str, str], tests: list[str]) -> list[str]:
    """The lines of the log that swebench's `parse_log_pytest` reads (step 8): one per test of the row, in the
    row's order, "STATUS test id", the status one of swebench's (`TestStatus`; anything else FAILED, and a test
    the run did not report FAILED). Only the row's own ids and those statuses are written: the test ids and
    statuses a report holds are the test process's words, and a newline or a space in one would be a line, or a
    status, of its own, which the parser reads as the host's (the last line of a test wins)."""
    from swebench.harness.constants import TestStatus

    statuses = {status.value for status in TestStatus}
    return [f"{status if status in statuses else 'FAILED'} {test}"
            for test, status in ((test, outcomes.get(test, "FAILED")) for test in tests)]


def grade_patch(
    task: dict,
    patch: str | None,
    config: SandboxConfig | None = None,
    test_cmd: str | None = None,
    eval_timeout: float = 300.0,
    log_chars: int = 4000,
) -> Grade:
    """Grade `patch` for `task` in a clean sandbox (see the module docstring). An empty patch is graded as
    swebench grades a missing one (not resolved, no tests run)."""
    from swebench.harness.constants import (
        APPLY_PATCH_FAIL,
        END_TEST_OUTPUT,
        START_TEST_OUTPUT,
        TESTS_ERROR,
        TESTS_TIMEOUT,
    )
    from swebench.harness.grading import get_eval_report

    config = config or SandboxConfig()
    if not task.get("patch"):
        raise ValueError(f"task {task.get('instance_id')!r} has no gold `patch`: grading compares the values the "
                         "tests look at with the gold patch's (rows of SWE-Gym and SWE-bench have one)")
    parts = split_test_cmd(task.get("test_cmd") or test_cmd or DEFAULT_TEST_CMD)
    f2p = as_test_list(task["FAIL_TO_PASS"], "FAIL_TO_PASS")
    p2p = as_test_list(task["PASS_TO_PASS"], "PASS_TO_PASS")
    files = test_files_of(f2p + p2p) or patch_paths(task["test_patch"])
    prediction = {"instance_id": task["instance_id"], "model_name_or_path": "trl-multiturn",
                  "model_patch": patch if patch and patch.strip() else None}
    script = run_script(".", *parts[:2], ".", parts[2], files)
    trusted_log, raw_log, timed_out, ignored, problem, unobserved, differ = "", "", False, [], "", [], []
    if prediction["model_patch"] is not None:
        texts: dict[str, str] = {}
        real = _test_run(task, patch, config, files, parts, f2p, eval_timeout, texts)
        raw_log, trusted_log, ignored, problem = real.log, real.trusted_log, real.ignored, real.problem
        if real.applied and not real.step_failed:
            trusted, problem, line, unobserved, differ = _verdict(task, real, config, files, parts, f2p, f2p + p2p,
                                                          eval_timeout, texts)
            raw_log += line
            # no exit-code line: the must-fail canary makes pytest's exit status 1 on every run
            trusted_log += "\n".join(["", START_TEST_OUTPUT, *log_lines(trusted, f2p + p2p), END_TEST_OUTPUT])
            if real.timed_out:
                timed_out = True
                trusted_log += f"\n{TESTS_TIMEOUT}\nTimeout error: {eval_timeout:g} seconds exceeded."
    spec = make_spec(task, script, config, f2p, p2p)
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "test_output.txt"
        log_path.write_text(trusted_log, encoding="utf-8")
        report = get_eval_report(spec, prediction, str(log_path), include_tests_status=True)[task["instance_id"]]
    if APPLY_PATCH_FAIL not in trusted_log and TESTS_ERROR in trusted_log:
        report["patch_successfully_applied"] = True  # swebench says "not applied" for any error; it did apply
    status = report.get("tests_status", {})
    f2p_ok = len(status.get("FAIL_TO_PASS", {}).get("success", []))
    p2p_ok = len(status.get("PASS_TO_PASS", {}).get("success", []))
    return Grade(
        resolved=bool(report["resolved"]),
        patch_applied=bool(report["patch_successfully_applied"]),
        f2p_passed=f2p_ok,
        f2p_total=len(f2p),
        p2p_passed=p2p_ok,
        p2p_total=len(p2p),
        timed_out=timed_out,
        report=report,
        log=truncate_middle(raw_log, log_chars),
        ignored_paths=ignored,
        problem=problem,
        unobserved=unobserved,
        differ=differ,
    )
