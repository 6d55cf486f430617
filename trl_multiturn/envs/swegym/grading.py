"""Grade a patch the way the SWE-bench harness does, in a clean checkout, with swebench's own code.

`grade_patch(task, patch, config)`:
1. starts a fresh sandbox at the task's base commit (a clean copy: nothing the agent did is there);
2. applies the patch with swebench's `GIT_APPLY_CMDS` in turn (git apply, 3-way, --reject, patch --fuzz=5),
   resetting the tree between attempts; if none works the log gets swebench's APPLY_PATCH_FAIL marker;
3. runs an eval script built in swebench's shape: reset the test files to the base commit, apply `test_patch`,
   run the tests between the start and end markers; `swebench.harness.utils.make_test_spec` adds the exit-code
   record, exactly as for SWE-bench instances;
4. grades the log with `swebench.harness.grading.get_eval_report` and the `parse_log_pytest` parser.

Our repositories are not in swebench's repository map, so the test spec is built from the row itself
(`log_parser="parse_log_pytest"`, `eval_type="pass_and_fail"`) rather than looked up; nothing here needs Docker
unless the sandbox is a `DockerSandbox`.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .patches import patch_paths
from .sandbox import SandboxConfig, make_sandbox, task_image, truncate_middle

DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider"
REWARD_MODES = ("resolved", "dense")


def as_test_list(value: Any, name: str) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS come as lists (SWE-Gym) or as JSON-encoded strings (SWE-bench on the Hub)."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of test ids (or its JSON string), got {type(value).__name__}")
    return list(value)


@dataclass
class Grade:
    """The verdict on one patch. `report` is swebench's report for the instance (with `tests_status`)."""

    resolved: bool
    patch_applied: bool
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    timed_out: bool = False
    report: dict = field(default_factory=dict)
    log: str = ""

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
        return (
            f"Issue {verdict}: {self.f2p_passed}/{self.f2p_total} failing tests now pass, "
            f"{self.p2p_passed}/{self.p2p_total} previously passing tests still pass."
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
        }


def eval_script(task: dict, test_cmd: str, test_patch_path: str, workdir: str) -> str:
    """The eval script in SWE-bench's shape (before `make_test_spec` adds the exit-code lines)."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    base = shlex.quote(task["base_commit"])
    files = [shlex.quote(f) for f in patch_paths(task["test_patch"])]
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {shlex.quote(workdir)}"]
    # a test file the base commit lacks cannot be checked out: remove it, as the test patch creates it
    restore_tests = [f"git checkout -q {base} -- {f} 2>/dev/null || rm -f -- {f}" for f in files]
    lines += restore_tests
    lines += [
        f"git apply --verbose {shlex.quote(test_patch_path)}",
        f"echo '{START_TEST_OUTPUT}'",
        f"{test_cmd} {' '.join(files)}",
        f"echo '{END_TEST_OUTPUT}'",
    ]
    lines += restore_tests
    return "\n".join(lines) + "\n"


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


def _apply_model_patch(sandbox, patch: str) -> tuple[bool, str]:
    """Apply `patch` as swebench's run_instance does; returns (applied, log text)."""
    from swebench.harness.constants import APPLY_PATCH_FAIL, APPLY_PATCH_PASS
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS

    path = shlex.quote(sandbox.write_scratch("model.patch", patch))
    result = None
    for attempt, command in enumerate(GIT_APPLY_CMDS):
        if attempt:
            sandbox.run("git checkout -- . ; git clean -fdq")
        result = sandbox.run(f"{command} {path}")
        if result.exit_code == 0:
            return True, f"{APPLY_PATCH_PASS}:\n{result.output}"
    if sandbox.run(f"git apply --check --reverse {path}").exit_code == 0:
        return True, f"{APPLY_PATCH_PASS}: verified already applied"
    return False, f"{APPLY_PATCH_FAIL}:\n{result.output if result else ''}"


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
    from swebench.harness.constants import TESTS_TIMEOUT
    from swebench.harness.grading import get_eval_report

    config = config or SandboxConfig()
    test_cmd = task.get("test_cmd") or test_cmd or DEFAULT_TEST_CMD
    f2p = as_test_list(task["FAIL_TO_PASS"], "FAIL_TO_PASS")
    p2p = as_test_list(task["PASS_TO_PASS"], "PASS_TO_PASS")
    prediction = {"instance_id": task["instance_id"], "model_name_or_path": "trl-multiturn",
                  "model_patch": patch if patch and patch.strip() else None}
    log, timed_out, spec = "", False, None
    if prediction["model_patch"] is not None:
        with make_sandbox(config) as sandbox:
            sandbox.start(task)
            applied, log = _apply_model_patch(sandbox, patch)
            if applied:
                test_patch_path = sandbox.write_scratch("test.patch", task["test_patch"])
                spec = make_spec(task, eval_script(task, test_cmd, test_patch_path, sandbox.workdir), config, f2p, p2p)
                script_path = sandbox.write_scratch("eval.sh", spec.eval_script)
                result = sandbox.run(f"/bin/bash {shlex.quote(script_path)}", timeout=eval_timeout)
                log += "\n" + result.output
                if result.timed_out:
                    timed_out = True
                    log += f"\n{TESTS_TIMEOUT}\nTimeout error: {eval_timeout:g} seconds exceeded."
    if spec is None:
        spec = make_spec(task, eval_script(task, test_cmd, "/dev/null", "."), config, f2p, p2p)
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "test_output.txt"
        log_path.write_text(log, encoding="utf-8")
        report = get_eval_report(spec, prediction, str(log_path), include_tests_status=True)[task["instance_id"]]
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
        log=truncate_middle(log, log_chars),
    )
