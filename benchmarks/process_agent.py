"""The agent of `agent_endpoint.py`'s process rows, run once per episode by `AgentCommand`: the same loop as its
thread agent (`agent_loops.py`, on the real client of the dialect, configured only by its environment), timing each
call, writing the times with its reward to $TRL_MULTITURN_RESULT.

    python process_agent.py TURNS DIALECT stream|whole
"""

import json
import os
import sys
import time
from types import SimpleNamespace

from agent_loops import DIALECTS

turns, dialect, stream = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "stream"
task = json.loads(open(os.environ["TRL_MULTITURN_TASK"]).read())
if dialect == "messages":
    import anthropic

    client = anthropic.Anthropic(max_retries=0)  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
else:
    import openai

    client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
session = SimpleNamespace(client=client, model=os.environ["TRL_MULTITURN_MODEL"])
history = [{"role": "user", "content": f"Task {task['i']}: explore."}]
latencies = []
for k in range(turns):
    t = time.perf_counter()
    reply = DIALECTS[dialect](session, history, stream)
    latencies.append(time.perf_counter() - t)
    history += reply + [{"role": "user", "content": f"You see room {k}."}]
with open(os.environ["TRL_MULTITURN_RESULT"], "w") as f:
    json.dump({"reward": 1.0, "info": {"latencies": latencies}}, f)
