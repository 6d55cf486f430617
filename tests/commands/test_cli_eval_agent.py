"""`trl-multiturn eval --agent` / `--agent_command`: an agent (a function, or a command line in its own process)
served by the model plays an environment's held-out tasks, into the evaluation's own result file."""

import json
import sys
from pathlib import Path

import pytest

from trl_multiturn.commands.cli import main

COMMAND_AGENT = Path(__file__).resolve().parents[1] / "agents" / "command_agent.py"

AGENT_MODULE = '''
from trl_multiturn.agents import AgentResult


def agent(task, session):
    """Asks the model once about the task's issue; wins on the tasks of one repository (a verdict to count)."""
    client = session.openai()
    client.chat.completions.create(model=session.model, messages=[{"role": "user", "content": task["repo"]}])
    return AgentResult(reward=0.5, won=task["repo"].endswith("semver"))
'''


@pytest.mark.parametrize("how", ["function", "command"])
def test_eval_of_an_agent_writes_the_evaluations_result_file(how, tiny_chatml_model, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_agent.py").write_text(AGENT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    agent = (["--agent", "my_agent:agent"] if how == "function"
             else ["--agent_command", f"{sys.executable} {COMMAND_AGENT}"])
    code = main(["eval", "--model_name_or_path", tiny_chatml_model, "--env", "swegym", "--num_eval_games", "3",
                 "--max_completion_length", "4", "--results_dir", str(tmp_path / "results"), "--no_progress",
                 *agent])
    out = capsys.readouterr().out
    assert code == 0, out
    (path,) = (tmp_path / "results").glob("eval_results_swegym_held-out_*.json")
    saved = json.loads(path.read_text())
    assert saved["settings"]["agent"] == agent[1]
    summary, outcomes = saved["summary"], saved["outcomes"]
    assert summary["n"] == 3 and summary["failed"] == 0 and len(outcomes) == 3
    assert all(o["num_turns"] == (1 if how == "function" else 2) and o["messages"] for o in outcomes)
    # the successes are the agent's verdicts: every task for the command agent, the semver task for the function
    wins = 3 if how == "command" else sum(o["task"]["repo"].endswith("semver") for o in outcomes)
    assert summary["successes"] == wins and [o["won"] for o in outcomes].count(True) == wins
    assert how == "command" or 0 < wins < 3  # the held-out tasks hold semver and others: the verdicts differ
    assert f"the agent {agent[1]} served by" in out


def test_an_agent_path_that_names_nothing_usable_is_refused():
    from trl_multiturn.agents.spec import agent_environment

    with pytest.raises(ValueError, match="agent='nowhere:agent' cannot be loaded"):
        agent_environment("nowhere:agent")
    with pytest.raises(ValueError, match="give one of them"):
        agent_environment("a:b", "mini -y")
