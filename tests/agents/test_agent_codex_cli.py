"""OpenAI's Codex CLI (npm `@openai/codex`, unmodified) on SWE-Gym through the training endpoint: Codex runs inside the
episode's local sandbox, reaching the endpoint through the relay, so the command it runs for the model runs there
(never on the host) and the graded patch is what it changed in the sandbox's checkout."""

import json
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from trl_multiturn.agents import AgentRunner
from trl_multiturn.agents.codex_cli import codex_cli_environment
from trl_multiturn.envs.swegym import SWEGymConfig, load_tasks
from trl_multiturn.envs.swegym import env as swegym_env
from trl_multiturn.rollout.rules import EpisodeRules

needs_codex = pytest.mark.skipif(shutil.which("codex") is None or shutil.which("bwrap") is None,
                                 reason="needs `npm install -g @openai/codex@0.171.0` (scripts/setup.sh) and bwrap")


def test_codex_settings_that_cannot_work_are_refused_when_built():
    with pytest.raises(ValueError, match=r"sandbox='docker'.*SWEGymConfig\(sandbox='local'\)"):
        codex_cli_environment(SWEGymConfig(sandbox="docker"))
    with pytest.raises(ValueError, match="codex_timeout=600.*below agent_timeout=600"):
        codex_cli_environment(SWEGymConfig(), codex_timeout=600, agent_timeout=600)


@needs_codex
def test_codex_runs_its_commands_in_the_sandbox_and_its_diff_is_graded(tiny_chatml_model, swegym_cache_dir,
                                                                        monkeypatch):
    """A stand-in for a model that knows what to do: its first reply calls Codex's `exec_command` tool (in the
    template's tool-call syntax), its second ends the episode. Node and Codex are in the episode's sandbox root
    only: the grading's sandboxes are built without them."""
    graded_with = []

    def grade_patch(task, patch, config, **kwargs):
        graded_with.append(list(config.root_extra))
        return real_grade_patch(task, patch, config, **kwargs)

    real_grade_patch = swegym_env.grade_patch
    monkeypatch.setattr(swegym_env, "grade_patch", grade_patch)
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    marker = f"/tmp/codex-cli-{secrets.token_hex(6)}"
    command = f"echo touched > CODEX_WAS_HERE.txt && echo host > {marker}; cat CODEX_WAS_HERE.txt"
    contexts = []

    def generate(batch, max_new_tokens):
        replies = []
        for context in batch:
            contexts.append(tokenizer.decode(context))
            text = "Done." if len(contexts) > 1 else "<tool_call>\n" + json.dumps(
                {"name": "exec_command", "arguments": {"cmd": command}}) + "\n</tool_call>"
            replies.append(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])
        return replies, None

    sandboxes = {p.name for p in Path(tempfile.gettempdir()).glob("swegym-*")}
    env_config = SWEGymConfig(repo_cache_dir=swegym_cache_dir, reward="dense")
    runner = AgentRunner(codex_cli_environment(env_config, codex_timeout=240, agent_timeout=400), tokenizer,
                         generate, EpisodeRules(max_turns=4, max_completion_length=200))
    try:
        (ep,) = runner(list(load_tasks(["rpn"])))
    finally:
        runner.close()
    assert not ep.failed, ep.failure
    assert len(contexts) == 2 and ep.num_turns == 2
    assert "exec_command" in contexts[0]  # Codex's own tools reached the policy through the template
    output = contexts[1].split("<tool_response>")[-1]
    assert "touched" in output  # the command ran and its output came back to the model
    info = ep.turns[-1].info
    assert info["codex_exit_code"] == 0 and "Done." in info["codex_output"]
    assert "CODEX_WAS_HERE.txt" in info["patch"] and "+touched" in info["patch"]  # graded: the sandbox's diff
    assert info["f2p_total"] > 0 and not info["resolved"] and not ep.won
    assert ep.turns[-1].reward == info["f2p_passed"] / info["f2p_total"]
    assert not Path(marker).exists()  # the command wrote inside the sandbox, not on the host
    assert {p.name for p in Path(tempfile.gettempdir()).glob("swegym-*")} <= sandboxes
    assert graded_with == [[]]
