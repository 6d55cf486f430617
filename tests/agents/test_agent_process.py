"""Agents in their own processes (`AgentCommand`): a command-line agent configured only by its environment (the
`openai` client, or the `anthropic` one) plays token-exact episodes; one whose episode fails is killed with its process
group (the kill that also ends one past its `agent_timeout`), what one leaves running is killed when it exits, a crash
fails only its episode with its output's tail, and its output is kept bounded."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn.agents import AgentCommand, AgentEnvironment, AgentRunner, AgentSession
from trl_multiturn.rollout.generation import hf_generate_fn
from trl_multiturn.rollout.rules import EpisodeRules

AGENT = [sys.executable, str(Path(__file__).with_name("command_agent.py"))]


@pytest.fixture(scope="module")
def policy(tiny_chatml_model):
    return AutoModelForCausalLM.from_pretrained(tiny_chatml_model).eval(), AutoTokenizer.from_pretrained(
        tiny_chatml_model)


def play(policy, rows, generate=None, **environment):
    model, tokenizer = policy
    calls = []
    generate = generate or hf_generate_fn(model, tokenizer)

    def recorded(contexts, max_new_tokens):
        completions, logprobs = generate(contexts, max_new_tokens)
        calls.extend(zip(map(tuple, contexts), completions))
        return completions, logprobs

    runner = AgentRunner(AgentEnvironment(AgentCommand(AGENT), **environment), tokenizer, recorded,
                         EpisodeRules(max_turns=4, max_completion_length=6))
    try:
        return runner(rows), dict(calls)
    finally:
        runner.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie is dead, not yet reaped


def test_a_command_line_agent_plays_token_exact_episodes_from_its_environment(policy):
    rows = [{"goal": "Find the key.", "turns": 2}, {"goal": "Open the chest.", "turns": 3},
            {"goal": "Go north.", "turns": 2, "mode": "anthropic"}]
    episodes, sampled = play(policy, rows, batch_wait=60.0)
    for row, ep in zip(rows, episodes):
        assert not ep.failed, ep.failure
        assert ep.num_turns == row["turns"] and ep.won and ep.turns[-1].reward == (1 + 2 * row["turns"]) / 10
        assert ep.turns[-1].info["command"]["returncode"] == 0
        for start, end in ep.turn_spans:  # each reply trained as sampled, from the context it was sampled from
            assert sampled[tuple(ep.prompt_ids + ep.completion_ids[:start])] == ep.completion_ids[start:end]


def test_a_failed_episodes_command_and_what_it_started_are_killed_and_so_is_what_one_leaves_behind(policy,
                                                                                                   tmp_path):
    _, tokenizer = policy
    fine = [tokenizer.encode("fine")[0], tokenizer.eos_token_id]
    rows = [{"mode": "hang", "turns": 1, "pid_file": str(tmp_path / "hang.pid")},
            {"mode": "leave_child", "turns": 1, "pid_file": str(tmp_path / "left.pid")}, {"turns": 1}]
    started = time.monotonic()
    episodes, _ = play(policy, rows, lambda contexts, n: ([fine for _ in contexts], None))
    assert time.monotonic() - started < 300  # not the 600 s the hung agent sleeps
    assert episodes[0].failed and "a malformed request" in episodes[0].failure
    assert not episodes[1].failed and not episodes[2].failed
    for name in ("hang", "left"):  # the hung agent's child died with its group; so did the one left behind
        pid = int((tmp_path / f"{name}.pid").read_text())
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), name


def test_a_crash_or_a_missing_reward_fails_only_its_episode(policy):
    _, tokenizer = policy
    fine = [tokenizer.encode("fine")[0], tokenizer.eos_token_id]
    rows = [{"mode": "crash", "turns": 1}, {"mode": "no_result", "turns": 1}, {"turns": 1}]
    episodes, _ = play(policy, rows, lambda contexts, n: ([fine for _ in contexts], None))
    crash, silent, ok = episodes
    assert crash.failed and "exited with status 3" in crash.failure and "the harness crashed" in crash.failure
    assert silent.failed and "wrote no reward to $TRL_MULTITURN_RESULT" in silent.failure
    assert not ok.failed


def test_the_output_is_kept_bounded_head_and_tail(policy):
    command = AgentCommand([sys.executable, "-c", "print('a' * 100_000); print('the end')"], output_limit=1000,
                           score=lambda task, run: 0.0)
    run = command.run({}, AgentSession("http://127.0.0.1:1/v1", "key", "policy", 10.0))
    assert run.returncode == 0 and not run.killed and run.result is None
    assert run.output.startswith("a" * 500) and run.output.rstrip().endswith("the end")
    assert "bytes of output dropped" in run.output and len(run.output) < 1100


@pytest.mark.parametrize("argv", [[], "mini -y", [["mini"]]])
def test_a_command_that_is_no_list_of_strings_is_refused(argv):
    with pytest.raises(ValueError, match="argv=.*non-empty list of strings"):
        AgentCommand(argv)


TRAINER = """
import sys
from trl_multiturn.agents import AgentCommand, AgentSession

agent = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
AgentCommand([sys.executable, "-c", agent, sys.argv[1]]).run({}, AgentSession("http://127.0.0.1:9/v1", "k", "m", 600))
"""


def test_a_command_dies_with_a_trainer_killed_by_sigkill(tmp_path):
    """SIGKILL runs no clean-up in the trainer; the kernel kills its running agent command with it
    (`process.DIE_WITH_TRAINER`)."""
    pid_file = tmp_path / "agent.pid"
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(pid_file)])
    try:
        while not (pid_file.exists() and pid_file.read_text()):
            assert trainer.poll() is None, "the trainer ended before its agent started"
            time.sleep(0.1)
        agent = int(pid_file.read_text())
        assert alive(agent)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        deadline = time.monotonic() + 60  # the kernel's signal comes at once; the reaping by init may lag under load
        while alive(agent) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(agent)
    finally:
        trainer.kill()
