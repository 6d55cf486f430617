"""Train the agent you already have: agents as environments, played against a token-recording chat endpoint.

`AgentEnvironment(agent)` as a trainer's `environment_factory` runs `agent(task_row, session)` once per episode;
the agent talks to the policy through OpenAI's chat-completions API at `session.base_url` with `session.api_key`
(`session.openai()` builds the client), and returns its reward; or `agent=AgentCommand(argv)` runs a program per
episode in its own process group, the endpoint in its environment (`process.py`). See `runner.py` for the
guarantees and `recording.py` for how requests become token-exact training samples.
"""

from .endpoint import ChatEndpoint
from .process import AgentCommand, CommandRun
from .runner import AgentEnvironment, AgentResult, AgentRunner, AgentSession

__all__ = ["AgentCommand", "AgentEnvironment", "AgentResult", "AgentRunner", "AgentSession", "ChatEndpoint",
           "CommandRun"]
