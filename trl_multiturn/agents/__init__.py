"""Train the agent you already have: agents as environments, played against a token-recording chat endpoint.

`AgentEnvironment(agent)` as a trainer's `environment_factory` runs `agent(task_row, session)` once per episode;
the agent talks to the policy at `session.base_url` with `session.api_key` in OpenAI's chat completions or
Responses API, or Anthropic's Messages API, streamed or not (`dialects.py`; `session.openai()` builds a client), and
returns its reward; or `agent=AgentCommand(argv)` runs a program per episode in its own process group, the endpoint
in its environment (`process.py`). See `runner.py` for the guarantees and `recording.py` for how requests become
token-exact training samples.
"""

from .endpoint import ChatEndpoint
from .process import AgentCommand, CommandRun
from .runner import AgentEnvironment, AgentResult, AgentRunner, AgentSession

__all__ = ["AgentCommand", "AgentEnvironment", "AgentResult", "AgentRunner", "AgentSession", "ChatEndpoint",
           "CommandRun"]
