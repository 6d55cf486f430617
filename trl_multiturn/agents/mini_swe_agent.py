"""mini-swe-agent (the PyPI package `mini-swe-agent`, unmodified) trained on SWE-Gym: its shell commands run in the
episode's SWE-Gym sandbox, and the episode is graded as `SWEGymEnv` grades it.

    from trl_multiturn.agents.mini_swe_agent import mini_swe_agent_environment
    from trl_multiturn.envs.swegym import SWEGymConfig, load_tasks

    trainer = MultiTurnGRPOTrainer(model=..., args=MultiTurnGRPOConfig(reward_mode="dense", max_turns=30, ...),
                                   train_dataset=load_tasks(),
                                   environment_factory=mini_swe_agent_environment(SWEGymConfig(), step_limit=30))

Per episode: a `SWEGymEnv` checks the task's repository out in a fresh sandbox (bubblewrap or Docker, as its config
says); mini-swe-agent's own `DefaultAgent` runs with its own config file (its packaged `mini.yaml` by default: its
system and instance templates, its `bash` tool, its observation template), its `LitellmModel` pointed at the
training endpoint through its ordinary settings (`model_name="openai/<model>"`, `model_kwargs` `api_base` and
`api_key`: set per episode in the config, because episodes share the trainer's process and so its environment
variables); and its environment is `SandboxEnvironment`, a mini-swe-agent environment class that hands each command to
the sandbox's `run` (the repository as its folder, the sandbox's command limits): no command of the agent's runs on
the host. When the agent submits (mini's `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`) or stops (its step limit,
repeated format errors), `SWEGymEnv.finish()` grades the checkout's diff in a clean copy, outside every process the
agent's commands ran in (envs/swegym/README.md); the reward and `won` are that grade's. The sandbox is closed when the
episode ends, however it ends.

A request past the trainer's `max_turns` is refused and truncates the episode, which is graded as it stands (set
mini's `step_limit` to stop it first). A refused request is not retried (mini's retry loop would wait minutes on an
episode that has failed).
"""

from __future__ import annotations

import copy
import os
import shlex
from pathlib import Path
from typing import Any

import litellm
import yaml

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # no banner per import in the training log
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import get_config_path  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

from ..envs.swegym import Sandbox, SWEGymConfig, SWEGymEnv  # noqa: E402
from .runner import AgentEnvironment, AgentResult, AgentSession  # noqa: E402


class SandboxEnvironment(LocalEnvironment):
    """A mini-swe-agent environment whose commands run in a SWE-Gym sandbox (`Sandbox.run`), in the repository's
    root; mini's `env` variables (its config's `environment.env`) are exported before each command. `commands` keeps
    every command run and its exit code (`{"command": ..., "exit_code": ...}`)."""

    def __init__(self, sandbox: Sandbox, **kwargs):
        super().__init__(**kwargs)
        self.sandbox = sandbox
        self.commands: list[dict] = []

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        exports = "".join(f"export {k}={shlex.quote(str(v))}; " for k, v in self.config.env.items())
        result = self.sandbox.run(exports + command)
        self.commands.append({"command": command, "exit_code": result.exit_code})
        output = {"output": result.output, "returncode": result.exit_code,
                  "exception_info": "the command ran past the sandbox's time limit" if result.timed_out else ""}
        raise_if_submitted(output)
        return output


SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's submit protocol: a command whose output's first line is this, exiting 0, ends the episode with the
rest of its output as the submission."""


def raise_if_submitted(output: dict) -> None:
    """mini's `Submitted` when `output` (a command's, as `execute` returns it) follows the submit protocol
    (`SUBMIT_LINE`). Each of mini's environments checks it in its own `execute` (no public helper holds it), so this
    environment does too."""
    lines = output.get("output", "").lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == SUBMIT_LINE and output["returncode"] == 0:
        submission = "".join(lines[1:])
        raise Submitted({"role": "exit", "content": submission,
                         "extra": {"exit_status": "Submitted", "submission": submission}})


def mini_swe_agent_settings(config: str | Path | dict = "mini.yaml", **agent_overrides) -> dict:
    """mini-swe-agent's settings: a config file of its own (a name it ships, e.g. "mini.yaml", or a path) or a dict,
    with `agent_overrides` over its `agent` section (e.g. step_limit=30)."""
    settings = copy.deepcopy(config) if isinstance(config, dict) else yaml.safe_load(
        get_config_path(config).read_text())
    settings.setdefault("agent", {}).update(agent_overrides)
    return settings


def mini_swe_agent_environment(env_config: SWEGymConfig | None = None, config: str | Path | dict = "mini.yaml", *,
                               agent_timeout: float = 3600.0, batch_wait: float | None = None,
                               **agent_overrides) -> AgentEnvironment:
    """The `AgentEnvironment` that plays mini-swe-agent on SWE-Gym rows (see the module docstring); `config` and
    `agent_overrides` as `mini_swe_agent_settings`; `batch_wait` None: `AgentEnvironment`'s default."""
    settings = mini_swe_agent_settings(config, **agent_overrides)
    env_config = env_config or SWEGymConfig()

    def mini_swe_agent(task: dict, session: AgentSession) -> AgentResult:
        env = SWEGymEnv(env_config)
        try:
            env.reset(task)  # a task or sandbox that cannot start raises: the episode fails, it scores nothing
            model = LitellmModel(**litellm_settings(settings.get("model", {}), session))
            model.abort_exceptions = [Exception]  # the endpoint never fails transiently: a refusal ends the episode
            shell = SandboxEnvironment(env.sandbox, **settings.get("environment", {}))
            agent = DefaultAgent(model, shell, **settings["agent"])
            try:
                exit_status = agent.run(task["problem_statement"]).get("exit_status", "")
            except litellm.exceptions.BadRequestError as exc:  # the turn budget is spent (or the episode failed,
                exit_status = f"refused: {exc}"                  # which no reward returned now changes)
            graded = env.finish()
        finally:
            env.close()
        return AgentResult(reward=graded.reward, won=graded.won, info={
            "exit_status": exit_status, "commands": shell.commands, **graded.info})

    waits = {} if batch_wait is None else {"batch_wait": batch_wait}
    return AgentEnvironment(mini_swe_agent, agent_timeout=agent_timeout, **waits)


def litellm_settings(model: dict, session: AgentSession) -> dict:
    """mini's `model` settings pointed at the episode's endpoint: litellm's OpenAI-compatible provider
    (`openai/<name>`), the endpoint's URL and the episode's key, no retries; cost tracking off (the policy has no
    price)."""
    model = {key: value for key, value in model.items() if key != "model_class"}
    kwargs = {**model.get("model_kwargs", {}), "api_base": session.base_url, "api_key": session.api_key,
              "num_retries": 0}
    return {**model, "model_name": f"openai/{session.model}", "model_kwargs": kwargs, "cost_tracking": "ignore_errors"}
