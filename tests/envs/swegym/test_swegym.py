"""SWE-Gym end to end on the shipped tasks: reproducible repositories, SWE-bench grading of every task, the
environment driven through `step` alone, runaway commands contained, the local sandbox's fallback modes, and the
Docker image names. (Containment: test_swegym_sandbox.py; attacks: test_swegym_attacks.py; Docker:
test_swegym_docker.py.)"""

import dataclasses
import os
import time
from pathlib import Path

import pytest

from trl_multiturn.envs import SWEGymEnv, TaskError
from trl_multiturn.envs.swegym import (
    LocalSandbox,
    SandboxConfig,
    SandboxError,
    SWEGymConfig,
    docker_image_name,
    grade_patch,
    task_rows,
)
from trl_multiturn.envs.swegym.patches import make_patch
from trl_multiturn.envs.swegym.tasks import shipped_repo, task_sources
from trl_multiturn.envs.swegym.tasks.source import AUTHOR, build_repo, git

SOURCES = {source.name: source for source in task_sources()}
ROWS = {row["repo"].split("/")[1]: row for row in task_rows()}
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def config(swegym_cache_dir):
    return SWEGymConfig(repo_cache_dir=swegym_cache_dir, command_timeout=3, max_processes=48,
                        max_observation_chars=2000)


# ---------------------------------------------------------------------------------------------------------------
# Reproducible repositories


def test_repositories_build_reproducibly(swegym_cache_dir, tmp_path):
    for name in ("intervals", "rpn"):
        source = SOURCES[name]
        head = build_repo(source, tmp_path / name)  # a second, independent build
        cached = Path(swegym_cache_dir) / f"{name}-{head[:12]}"
        assert head == source.base_commit == git(["rev-parse", "HEAD"], cached).strip()
        log = git(["log", "--format=%an <%ae> %aI %cI"], tmp_path / name).splitlines()
        assert len(log) == len(source.commits) >= 2
        assert all(line.startswith(f"{AUTHOR[0]} <{AUTHOR[1]}> 2024-05-01T") for line in log)
        for edit in source.fix:  # the history ends before the fix
            text = (tmp_path / name / edit.path).read_text()
            assert edit.old in text and edit.new not in text


def test_changed_sources_fail_the_hash_check(tmp_path):
    changed = dataclasses.replace(SOURCES["roman"], summary="A different README changes every hash.")
    with pytest.raises(RuntimeError, match="hashed to"):
        build_repo(changed, tmp_path / "roman")
    with pytest.raises(TaskError, match="base_commit"):
        shipped_repo("trl-multiturn/roman", "0" * 40, tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# Grading with swebench's report


def _noop_patch(name: str) -> str:
    """A comment added to the file the gold patch fixes: it applies cleanly and fixes nothing."""
    source = SOURCES[name]
    path = source.fix[0].path
    before = source.files_at_base()
    return make_patch({path: before[path]}, {path: "# a comment that fixes nothing\n" + before[path]})


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_task_grades_gold_empty_noop_and_garbage(name, swegym_cache_dir):
    row, cfg = ROWS[name], SandboxConfig(repo_cache_dir=swegym_cache_dir)
    n_f2p, n_p2p = len(row["FAIL_TO_PASS"]), len(row["PASS_TO_PASS"])

    gold = grade_patch(row, row["patch"], cfg)
    assert gold.resolved and gold.patch_applied
    assert (gold.f2p_passed, gold.p2p_passed) == (n_f2p, n_p2p)
    assert gold.reward("resolved") == gold.reward("dense") == 1.0
    assert gold.report["tests_status"]["FAIL_TO_PASS"]["failure"] == []
    # every test's checks reported values, and the right fix's are the gold run's
    n = n_f2p + n_p2p
    assert gold.problem == "" and gold.unobserved == [] and f"values of {n} passing tests were compared" in gold.log
    assert f"{n} passing tests were compared with the gold patch's run, in a sandbox of its own: 0 differ" in gold.log

    noop = grade_patch(row, _noop_patch(name), cfg)
    assert noop.patch_applied and not noop.resolved
    assert (noop.f2p_passed, noop.p2p_passed) == (0, n_p2p)  # FAIL_TO_PASS really fail at the base commit
    assert noop.reward("resolved") == noop.reward("dense") == 0.0

    empty = grade_patch(row, "", cfg)
    assert not empty.resolved and empty.report["patch_is_None"] and empty.reward("dense") == 0.0

    garbage = grade_patch(row, "this is not a diff\n@@ nonsense @@\n", cfg)
    assert not garbage.patch_applied and not garbage.resolved and garbage.reward("dense") == 0.0
    assert "Patch Apply Failed" in garbage.log and garbage.summary() == "The patch could not be applied."


def test_dense_reward_counts_fail_to_pass_only_while_pass_to_pass_hold(swegym_cache_dir):
    row, cfg = ROWS["rpn"], SandboxConfig(repo_cache_dir=swegym_cache_dir)
    evaluator = SOURCES["rpn"].files_at_base()["rpn/evaluator.py"]
    half = evaluator.replace('"-": operator.sub', '"-": lambda a, b: b - a')
    partial = grade_patch(row, make_patch({"rpn/evaluator.py": evaluator}, {"rpn/evaluator.py": half}), cfg)
    assert (partial.f2p_passed, partial.f2p_total, partial.resolved) == (1, 2, False)
    assert partial.reward("dense") == 0.5 and partial.reward("resolved") == 0.0

    tokens = SOURCES["rpn"].files_at_base()["rpn/tokens.py"]
    broken = tokens.replace('float(word) if "." in word else int(word)', "int(float(word))")
    regress = make_patch({"rpn/tokens.py": tokens}, {"rpn/tokens.py": broken}) + row["patch"]
    graded = grade_patch(row, regress, cfg)
    assert graded.patch_applied and graded.f2p_passed == 2 and graded.p2p_passed < graded.p2p_total
    assert graded.reward("dense") == 0.0 and not graded.resolved


def test_a_hanging_test_run_is_cut_at_eval_timeout(swegym_cache_dir):
    row = ROWS["wordfreq"]
    module = SOURCES["wordfreq"].files_at_base()["wordfreq/tokenize.py"]
    hanging = "import time\ntime.sleep(600)\n" + module
    hang = make_patch({"wordfreq/tokenize.py": module}, {"wordfreq/tokenize.py": hanging})
    graded = grade_patch(row, hang, SandboxConfig(repo_cache_dir=swegym_cache_dir), eval_timeout=3)
    assert graded.timed_out and not graded.resolved and graded.summary() == "The tests timed out."


# ---------------------------------------------------------------------------------------------------------------
# The environment, through step() alone


def test_scripted_agent_solves_a_task_through_step(config):
    env = SWEGymEnv(config)
    first = env.reset(ROWS["ledger"])
    assert "A failed transfer still credits the target account" in first and "<submit/>" in first
    view = env.step('I will look at the transfer code.\n<view path="ledger/transfer.py" lines="15-25"/>')
    assert "target.deposit(amount)" in view.observation and not view.done
    edit = env.step(
        '<replace path="ledger/transfer.py">\n<old>\n        target.deposit(amount)\n        source.withdraw(amount)\n'
        "</old>\n<new>\n        source.withdraw(amount)\n        target.deposit(amount)\n</new>\n</replace>"
    )
    assert "Edited ledger/transfer.py" in edit.observation and edit.reward == 0.0 and not edit.done
    run = env.step("<bash>python -m pytest -q -p no:cacheprovider 2>&1 | tail -1</bash>")
    assert "4 passed" in run.observation and "[exit code: 0]" in run.observation
    final = env.step("<submit/>")
    assert final.done and final.won and final.reward == 1.0
    assert final.info["resolved"] and "source.withdraw(amount)" in final.info["patch"]
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("<submit/>")
    env.close()


def test_expert_actions_solve_a_task(config):
    """Every task's expert replies solve it through step() in its container (test_swegym_docker.py), reproduce its
    fix as edits (test_swegym_actions.py) and its gold patch grades here (above): once through the local sandbox."""
    name = "intervals"
    env = SWEGymEnv(config)
    env.reset(ROWS[name])
    actions = env.expert_actions(ROWS[name])
    results = [env.step(action) for action in actions]
    assert all(not r.done for r in results[:-1]) and all("[error]" not in r.observation for r in results)
    assert results[-1].done and results[-1].won and results[-1].reward == 1.0
    env.close()


def test_bad_replies_cost_a_turn_and_the_turn_limit_submits_the_diff(config):
    env = SWEGymEnv(config, submit_after_turns=3, reward="dense")
    env.reset(ROWS["matrix"])
    bad = env.step("The transpose looks wrong to me.")
    assert "[error] no action found" in bad.observation and not bad.done and bad.info["action"] == "invalid"
    missing = env.step('<replace path="matrix/ops.py"><old>not in the file</old><new>x</new></replace>')
    assert "occurs 0 times" in missing.observation and not missing.done
    half_fix = env.step('<replace path="matrix/ops.py"><old>for i in range(len(m))]</old>'
                        "<new>for i in range(len(m[0]) if m else 0)]</new></replace>")
    assert half_fix.done and half_fix.info["submitted_by"] == "turn_limit"
    assert "Turn limit reached" in half_fix.observation and "Edited matrix/ops.py" in half_fix.observation
    assert half_fix.info["f2p_passed"] == 2 and half_fix.won and half_fix.reward == 1.0


def test_finish_grades_the_current_diff_once(config):
    env = SWEGymEnv(config)
    env.reset(ROWS["envfile"])
    unchanged = env.finish()  # nothing changed: graded as an empty patch
    assert unchanged.done and not unchanged.won and unchanged.reward == 0.0 and unchanged.info["patch"] == ""
    env.reset(ROWS["envfile"])
    env.step('<replace path="envfile/parser.py"><old>line.split("=")</old><new>line.split("=", 1)</new></replace>')
    final = env.finish()
    assert final.done and final.won and final.reward == 1.0 and final.info["submitted_by"] == "truncated"
    assert env.finish() is None


def test_rows_missing_columns_raise_task_error(config):
    row = dict(ROWS["roman"])
    del row["test_patch"]
    with pytest.raises(TaskError, match="test_patch"):
        SWEGymEnv(config).reset(row)
    without_gold = {k: v for k, v in ROWS["roman"].items() if k != "patch"}  # grading's expected values
    with pytest.raises(TaskError, match="'patch'"):
        SWEGymEnv(config).reset(without_gold)
    with pytest.raises(ValueError, match="no gold `patch`"):
        grade_patch(without_gold, ROWS["roman"]["patch"], config)
    # a gold patch that does not apply leaves nothing to compare a passing run with: the grading fails, never a 0
    broken_gold = {**ROWS["roman"], "patch": "this is not a diff\n"}
    with pytest.raises(SandboxError, match="the gold patch's run did not run properly: the gold patch did not apply"):
        grade_patch(broken_gold, ROWS["roman"]["patch"], config)
    with pytest.raises(TaskError, match="repos_dir"):
        SWEGymEnv(config).reset({**ROWS["roman"], "repo": "someone/elsewhere"})


def test_runaway_commands_are_contained_and_the_episode_goes_on(config):
    env = SWEGymEnv(config)
    env.reset(ROWS["slugkit"])
    sandbox, workdir = env.sandbox, env.sandbox.workdir

    slow = env.step("<bash>sleep 1000</bash>")
    assert slow.info["timed_out"] and "killed: the command ran past the 3 s" in slow.observation

    flood = env.step(
        "<bash>python -c \"\nimport os, time\nfor i in range(500):\n    if os.fork() == 0:\n"
        "        time.sleep(300)\n        os._exit(0)\n\"</bash>"
    )
    assert "Resource temporarily unavailable" in flood.observation and flood.info["exit_code"] != 0

    huge = env.step("<bash>python -c \"print('x' * 3_000_000)\"</bash>")
    assert huge.info["truncated"] and "characters truncated" in huge.observation
    assert len(huge.observation) < config.max_observation_chars + 200

    memory = env.step("<bash>python -c \"bytearray(8 * 1024 ** 3)\"</bash>")
    assert "MemoryError" in memory.observation

    outside = env.step("<bash>touch ../escaped /usr/escaped /etc/escaped; echo done</bash>")
    assert outside.observation.count("Permission denied") + outside.observation.count("Read-only") == 3
    assert not any(Path(p).exists() for p in (sandbox.host_workdir.parent / "escaped", "/usr/escaped"))
    if AS_ROOT:  # the sandbox runs as a uid of its own
        assert _processes_of(sandbox.uid) == []  # nothing the flood or the sleeper started is still running
    assert "done" in outside.observation

    escape = env.step('<create path="../outside.py">x = 1\n</create>')
    assert "[error]" in escape.observation and "outside the repository" in escape.observation

    fix = env.step('<replace path="slugkit/slug.py"><old>slug[:max_length]</old>'
                   "<new>slug[:max_length].rstrip(sep)</new></replace>")
    assert "Edited" in fix.observation
    assert env.step("<submit/>").won
    assert not Path(workdir).exists()  # submitting released the agent's checkout


def test_local_sandbox_checkout_and_cleanup(config):
    row = ROWS["durations"]
    with LocalSandbox(config) as sandbox:
        sandbox.start(row)
        assert sandbox.run("git rev-parse HEAD").output.strip() == row["base_commit"]
        assert sandbox.run("git remote").output.strip() == ""
        assert sandbox.run("pwd").output.strip() == sandbox.workdir == "/testbed"
        sandbox.run("sleep 100 &")  # a background process does not outlive its command
        if AS_ROOT:
            assert sandbox.host_workdir.stat().st_uid == sandbox.uid != 0
            assert _processes_of(sandbox.uid) == []
        tmp = sandbox.host_workdir.parent
    assert not tmp.exists()


def _processes_of(uid: int) -> list[int]:
    """Pids of `uid`'s processes that are not zombies."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and proc.stat().st_uid == uid:
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(proc.name))
        except (OSError, IndexError):
            continue
    return pids


def _running(command_line: str) -> bool:
    """Whether a live process has exactly this command line."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().replace(b"\0", b" ").strip() == (
                    command_line.encode()) and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                return True
        except (OSError, IndexError):
            continue
    return False


@pytest.mark.parametrize("mode", [{"isolation": "none"}, {"run_as_uid": "none"}], ids=["no-isolation", "uid-0"])
def test_fallback_modes_still_time_out_and_clean_up(config, mode):
    """Without bubblewrap (the process group is killed after each command) and as uid 0 under bubblewrap (the
    PID namespace ends with the command): timeouts hold and nothing is left running."""
    sleeper = f"sleep {300 + os.getpid() % 1000}.5"
    with LocalSandbox(dataclasses.replace(config, command_timeout=1, **mode)) as sandbox:
        sandbox.start(ROWS["roman"])
        slow = sandbox.run("sleep 1000")
        assert slow.timed_out and slow.exit_code == 124 and slow.output.endswith("[command timed out after 1 s]\n")
        sandbox.run(f"{sleeper} >/dev/null &")
        deadline = time.monotonic() + 60  # SIGKILL was sent; give the dying process time to be scheduled
        while _running(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(sleeper)
        assert sandbox.run("echo still here").output == "still here\n"


# ---------------------------------------------------------------------------------------------------------------
# Docker image names (the engine itself: test_swegym_docker.py)


def test_docker_image_names_follow_swegym_and_swebench():
    from swebench.image_builder.image_spec import ImageSpec

    assert docker_image_name("getmoto__moto-7365") == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365:latest"
    assert docker_image_name("Project-MONAI__MONAI-3715").endswith("project-monai_s_monai-3715:latest")
    swebench_cfg = SandboxConfig(docker_image_template="swebench/sweb.eval.x86_64.{instance_id}:latest",
                                 docker_dunder="_1776_")
    harness = ImageSpec(instance_id="django__django-11333", dockerfile="FROM x", namespace="swebench").name
    assert docker_image_name("django__django-11333", swebench_cfg) == harness
