"""OpenAI's Codex CLI (the npm package `@openai/codex`, unmodified) trained on SWE-Gym: Codex itself runs inside the
episode's local SWE-Gym sandbox, so every shell command it runs runs there, on the checkout that is graded.

    from trl_multiturn.agents.codex_cli import codex_cli_environment
    from trl_multiturn.envs.swegym import SWEGymConfig, load_tasks

    trainer = MultiTurnGRPOTrainer(model=..., args=MultiTurnGRPOConfig(reward_mode="dense", max_turns=30, ...),
                                   train_dataset=load_tasks(),
                                   environment_factory=codex_cli_environment(SWEGymConfig()))

Setup: `npm install -g @openai/codex@0.171.0` (scripts/setup.sh does it as root), so that `codex` and node lie under
/usr; the sandbox's private root (`envs/swegym/sandbox/rootfs.py`) gets node, the `codex` link and the package
(`SWEGymEnv`'s `episode_root_extra`: about 520 MB more per concurrent episode; the grading sandboxes do not
copy them); the package and its native binary come from the npm
registry, with no download at install or run time.

Per episode: a `SWEGymEnv` checks the task's repository out in a fresh local sandbox (bubblewrap; the Docker sandbox
is not supported: the relay below binds into the local sandbox's folder); the endpoint is relayed into the sandbox
(`sandbox_endpoint.py`: the commands have no network); `codex exec` runs there as one sandbox command (the
sandbox's limits, `codex_timeout` as its time limit) in the repository, `HOME` and `CODEX_HOME` in the sandbox's
/tmp, with the task's problem statement as its prompt and a model provider of its own config pointed at the
endpoint in the Responses dialect; its own sandbox is off (`--dangerously-bypass-approvals-and-sandbox`: the SWE-Gym
sandbox confines it, and Codex's Linux sandbox cannot nest in it), and two built-in tools that are no function
tools are switched off (the endpoint refuses them: `--disable multi_agent`, `web_search="disabled"`). When Codex
exits, however it exits (done, a request refused past `max_turns`, its time limit), `SWEGymEnv.finish()` grades the
checkout's diff in a clean copy, as every SWE-Gym episode is graded; the reward and `won` are the grade's, Codex's exit
status and the tail of its output are in the last turn's `info`. The sandbox is closed however the episode ends.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from ..envs.swegym import SandboxError, SWEGymConfig, SWEGymEnv
from ..envs.swegym.sandbox import truncate_middle
from .runner import AgentEnvironment, AgentResult, AgentSession
from .sandbox_endpoint import SandboxEndpoint

CODEX_FLAGS = ["--disable", "multi_agent", "-c", 'web_search="disabled"', "--skip-git-repo-check",
               "--dangerously-bypass-approvals-and-sandbox", "--color", "never"]
"""Codex's flags for a training episode (see the module docstring)."""


def codex_script(model: str, prompt_path: str, extra_args: list[str] = ()) -> str:
    """The shell script that runs `codex exec` on the prompt in `prompt_path` against the endpoint at
    `$OPENAI_BASE_URL` (set by the relay), as model `model`, with the key in `$OPENAI_API_KEY`."""
    provider = ('model_providers.trl={name="trl", base_url="\'"$OPENAI_BASE_URL"\'", env_key="OPENAI_API_KEY", '
                'wire_api="responses"}')
    args = [*CODEX_FLAGS, "-c", "model_provider=trl", *extra_args, "-m", model]
    return ('export HOME=/tmp CODEX_HOME=/tmp/.codex; mkdir -p "$CODEX_HOME"; '
            f"exec codex exec {shlex.join(args)} -c '{provider}' \"$(cat {shlex.quote(prompt_path)})\"")


def codex_cli_environment(env_config: SWEGymConfig | None = None, *, codex_timeout: float = 1800.0,
                          agent_timeout: float = 3600.0, batch_wait: float | None = None,
                          extra_args: list[str] = ()) -> AgentEnvironment:
    """The `AgentEnvironment` that plays Codex CLI on SWE-Gym rows (see the module docstring). `codex_timeout`:
    Codex's time limit (the sandbox command's), after which its diff is graded; `agent_timeout` the episode's, which
    must also cover the sandbox's start and the grading; `extra_args`: more `codex exec` arguments (e.g.
    `["-c", 'model_reasoning_effort="low"']`); `batch_wait` None: `AgentEnvironment`'s default."""
    env_config = env_config or SWEGymConfig()
    if not 0 < codex_timeout < agent_timeout:
        raise ValueError(f"codex_cli_environment: codex_timeout={codex_timeout} must be positive and below "
                         f"agent_timeout={agent_timeout}, which also covers the sandbox's start and the grading")
    if env_config.sandbox != "local":
        raise ValueError(f"codex_cli_environment: sandbox={env_config.sandbox!r}; Codex runs inside the local "
                         "sandbox only: set SWEGymConfig(sandbox='local')")
    programs = {}
    for program in ("codex", "node"):
        found = shutil.which(program)
        if found is None or not Path(found).resolve().is_relative_to("/usr"):
            raise SandboxError(f"codex_cli_environment: `{program}` must be installed under /usr, where the sandbox "
                               f"finds it on PATH (found: {found}): `npm install -g @openai/codex@0.171.0` as root "
                               "(scripts/setup.sh), node from the Debian archive")
        programs[program] = found
    # the sandbox's private root holds only what the tasks need: node, codex's link and its package come along
    package = Path(programs["codex"]).resolve().parents[1]
    episode_root_extra = (*programs.values(), str(package))  # the episode's sandbox only; grading never runs Codex

    def codex_cli(task: dict, session: AgentSession) -> AgentResult:
        env = SWEGymEnv(env_config, episode_root_extra=episode_root_extra)
        try:
            env.reset(task)  # a task or sandbox that cannot start raises: the episode fails, it scores nothing
            prompt = env.sandbox.write_scratch("codex_prompt.md", task["problem_statement"])
            with SandboxEndpoint(env.sandbox, session.base_url, session.api_key) as relay:
                run = env.sandbox.run(relay.command(codex_script(session.model, prompt, list(extra_args))),
                                      timeout=codex_timeout, ignore_flock=True)
            graded = env.finish()
        finally:
            env.close()
        return AgentResult(reward=graded.reward, won=graded.won, info={
            "codex_exit_code": run.exit_code, "codex_timed_out": run.timed_out,
            "codex_output": truncate_middle(run.output, 4000), **graded.info})

    waits = {} if batch_wait is None else {"batch_wait": batch_wait}
    return AgentEnvironment(codex_cli, agent_timeout=agent_timeout, **waits)
