"""Grade a patch the way the SWE-bench harness does, in a clean checkout, so that the patch cannot steer it.

`grade_patch(task, patch, config)`:
1. starts a fresh sandbox at the task's base commit (a clean copy: nothing the agent did is there) and moves
   its `.git` into the scratch folder, where grading's own git commands use it: nothing the patch writes can
   reach the git configuration, hooks or index that grading relies on;
2. applies the patch with swebench's `GIT_APPLY_CMDS` in turn (git apply, 3-way, --reject, patch --fuzz=5),
   resetting the tree between attempts; if none works the log gets swebench's APPLY_PATCH_FAIL marker;
3. restores every file the patch may not touch (`integrity.protected_reason`: tests, pytest configuration,
   conftest.py, start-up hooks, package metadata) and removes those it added;
4. resets the test files to the base commit and applies `test_patch`, as swebench's eval script does, deletes
   both patches from the scratch folder (the tests' code cannot read the hidden tests from there), then plants
   canary tests in each test file (`integrity.plant_canaries`);
5. runs the tests through `pytest_runner.py` (the row's `test_cmd` says which pytest options), ends every
   process of the sandbox, and reads the outcomes from the runner's token-signed report only;
6. judges the run by its canaries (`integrity.judge`);
7. does 1-6 again in another fresh sandbox with each FAIL_TO_PASS test replaced by its mutation twin
   (`twins.make_twins`: the same test expecting a wrong value, which a right answer fails), the two runs in random
   order; a test that passed while its twin passed too is tampering (`integrity.judge_twins`). The twin run is left
   out when the real one went first and no test with a twin passed in it;
8. grades the trusted outcomes of the real run with `swebench.harness.grading.get_eval_report` and its
   `parse_log_pytest` parser.

Any step of grading's own that fails (the protected files cannot be restored, the test patch does not apply)
scores 0. Our repositories are not in swebench's repository map, so the test spec is built from the row itself
(`log_parser="parse_log_pytest"`, `eval_type="pass_and_fail"`) rather than looked up.
"""

from __future__ import annotations

import ast
import json
import random
import re
import secrets
import shlex
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .integrity import PASSING, judge, judge_twins, plant_canaries, protected_reason, read_report, test_files_of
from .patches import patch_paths
from .sandbox import Sandbox, SandboxConfig, make_sandbox, task_image, truncate_middle
from .twins import function_name, make_twins

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
    `untwinned` the FAIL_TO_PASS tests that got no mutation twin, with why (their passes are not vouched for)."""

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
    untwinned: dict[str, str] = field(default_factory=dict)

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
            "untwinned_tests": dict(self.untwinned),
        }


def run_script(workdir: str, assignments: list[str], python: str, scratch: str, args: list[str],
               files: list[str]) -> str:
    """The test run, in SWE-bench's eval-script shape (before `make_test_spec` adds the exit-code lines)."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    command = [*assignments, python, "-s", f"{scratch}/pytest_runner.py", f"{scratch}/token", f"{scratch}/report",
               f"{scratch}/audit.json", *args, *files]
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


class _Grading:
    """The steps of grading inside one sandbox; every git command uses the git folder kept in scratch."""

    def __init__(self, sandbox: Sandbox, task: dict):
        self.sandbox, self.task = sandbox, task
        scratch = shlex.quote(sandbox.scratch_dir)
        self.git_env = f"export GIT_DIR={scratch}/git GIT_WORK_TREE=.; "
        self.base = shlex.quote(task["base_commit"])

    def run(self, command: str, **kwargs):
        return self.sandbox.run(self.git_env + command, **kwargs)

    def _paths(self, *commands: str) -> list[list[str]]:
        """The NUL-separated paths each of `commands` prints, from one sandbox command (each costs ~0.2 s in
        Docker). The lists are separated by a lone "/", which no relative path can be."""
        result = self.run(" && printf '\\0/\\0' && ".join(commands))
        if result.exit_code != 0:
            raise _TrustedStepFailed(f"{commands[-1]}: {result.output[-500:]}")
        sections = result.output.split("\0/\0")
        return [[p for p in section.split("\0") if p] for section in sections]

    def isolate_git(self) -> set[str]:
        """Move `.git` out of the checkout; returns the untracked files the clean checkout already has."""
        scratch = shlex.quote(self.sandbox.scratch_dir)
        return set(self._paths(f"rm -rf {scratch}/git && mv .git {scratch}/git && git ls-files --others -z")[0])

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
            f"git diff --name-only --no-renames -z {self.base}", "git ls-files --others -z",
            f"git ls-tree -r -z --name-only {self.base}",
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
        diff, tracked = self._paths(
            f"git diff -U0 --no-color --no-ext-diff --no-textconv --no-renames {self.base} "
            "| grep -aE '^(\\+\\+\\+ |@@ )' || true", f"git ls-tree -r -z --name-only {self.base}")
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
    """One test run of grading: `outcomes` are the trusted ones (canaries left out), `log` what the agent may see."""

    applied: bool
    log: str = ""
    trusted_log: str = ""
    outcomes: dict[str, str] = field(default_factory=dict)
    problem: str = ""
    timed_out: bool = False
    ignored: list[str] = field(default_factory=list)
    twinned: list[str] = field(default_factory=list)
    untwinned: dict[str, str] = field(default_factory=dict)
    step_failed: bool = False


def _test_run(task: dict, patch: str, config: SandboxConfig, files: list[str], test_cmd: tuple, f2p: list[str],
              eval_timeout: float, twin: bool) -> _Run:
    """Steps 1-6 of the module docstring in a fresh sandbox; with `twin`, the FAIL_TO_PASS tests are their twins."""
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
            rng = random.Random(secrets.randbits(64))
            canaries = []
            for path in files:
                names = [function_name(t) for t in f2p if t.split("::")[0] == path]
                twins = make_twins(sandbox.read_file(path), names, rng)
                run.twinned += [t for t in f2p if t.split("::")[0] == path and function_name(t) in twins.twinned]
                run.untwinned |= {t: twins.untwinned[function_name(t)] for t in f2p
                                  if t.split("::")[0] == path and function_name(t) in twins.untwinned}
                text, planted = plant_canaries(path, twins.twin if twin else twins.real, rng)
                sandbox.write_file(path, text)
                canaries += planted
            token = secrets.token_hex(16)
            sandbox.write_scratch("pytest_runner.py", RUNNER.read_text())
            sandbox.write_scratch("token", token)
            sandbox.write_scratch("audit.json", json.dumps(audit))
            sandbox.write_scratch("report", "", write_only=True)
            script = run_script(sandbox.workdir, assignments, python, sandbox.scratch_dir, pytest_args, files)
            result = sandbox.run(f"/bin/bash {shlex.quote(sandbox.write_scratch('eval.sh', script))}",
                                 timeout=eval_timeout)
            sandbox.stop()  # nothing the tests started may write the report after this
            run.log += "\n" + result.output
            run.outcomes, run.problem = judge(read_report(sandbox.read_scratch("report"), token), canaries)
            run.timed_out = result.timed_out
        except _TrustedStepFailed as e:
            run.problem, run.step_failed = str(e), True
            run.trusted_log += f"\n{TESTS_ERROR}: {e}"
            run.log += f"\n{e}"
    return run


def twin_verdict(real: _Run, twin: _Run) -> tuple[dict[str, str], str]:
    """The outcomes of the real run grading trusts once the twin run has been judged, and the problem ("" if none).

    The twins are judged whatever the real run reported: a test file whose canaries broke (its own tests count as
    failed) does not let another file's passes go unjudged (issue 54). A twin verdict fails every test."""
    twin_problem = judge_twins(real.outcomes, twin.outcomes, real.twinned, twin.problem)
    if not twin_problem or real.problem.startswith("tampering"):
        return real.outcomes, real.problem
    problem = f"{twin_problem} (and {real.problem})" if real.problem else twin_problem
    return {t: "FAILED" for t in real.outcomes}, problem


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
    parts = split_test_cmd(task.get("test_cmd") or test_cmd or DEFAULT_TEST_CMD)
    f2p = as_test_list(task["FAIL_TO_PASS"], "FAIL_TO_PASS")
    p2p = as_test_list(task["PASS_TO_PASS"], "PASS_TO_PASS")
    files = test_files_of(f2p + p2p) or patch_paths(task["test_patch"])
    prediction = {"instance_id": task["instance_id"], "model_name_or_path": "trl-multiturn",
                  "model_patch": patch if patch and patch.strip() else None}
    script = run_script(".", *parts[:2], ".", parts[2], files)
    trusted_log, raw_log, timed_out, ignored, problem, untwinned = "", "", False, [], "", {}
    if prediction["model_patch"] is not None:
        runs: dict[bool, _Run] = {}
        for twin in random.Random(secrets.randbits(64)).sample([False, True], 2):  # which run goes first
            first = runs.get(not twin)
            if first is not None and (not first.applied or first.step_failed):
                break  # the same patch and steps: the same outcome
            if twin and first is not None and not any(first.outcomes.get(t) in PASSING for t in first.twinned):
                break  # no test with a twin passed: there is no pass for a twin to vouch for
            runs[twin] = _test_run(task, patch, config, files, parts, f2p, eval_timeout, twin)
        twin_run = runs.get(True)
        real = runs.get(False) or replace(twin_run, outcomes={})  # the twin run went first and broke
        raw_log, trusted_log, ignored, problem = real.log, real.trusted_log, real.ignored, real.problem
        untwinned, trusted = real.untwinned, real.outcomes
        if real.applied and not real.step_failed:
            if False in runs and twin_run is not None:
                trusted, problem = twin_verdict(real, twin_run)
                raw_log += f"\n[the twins of {len(real.twinned)} tests ran in a sandbox of their own]"
            trusted = {**{test: "FAILED" for test in f2p + p2p}, **trusted}  # a missing test failed
            lines = [f"{status} {test}" for test, status in trusted.items()]
            # no exit-code line: the must-fail canary makes pytest's exit status 1 on every run
            trusted_log += "\n".join(["", START_TEST_OUTPUT, *lines, END_TEST_OUTPUT])
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
        untwinned=untwinned,
    )
