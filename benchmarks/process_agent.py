"""The agent of `agent_endpoint.py`'s process rows, run once per episode by `AgentCommand`: the same loop as its
thread agent (the real `openai` client, configured only by its environment), timing each call, writing the times
with its reward to $TRL_MULTITURN_RESULT."""

import json
import os
import sys
import time

import openai

turns, new_tokens = int(sys.argv[1]), int(sys.argv[2])
task = json.loads(open(os.environ["TRL_MULTITURN_TASK"]).read())
client = openai.OpenAI(max_retries=0)
messages = [{"role": "user", "content": f"Task {task['i']}: explore."}]
latencies = []
for k in range(turns):
    t = time.perf_counter()
    reply = client.chat.completions.create(model=os.environ["TRL_MULTITURN_MODEL"], messages=messages,
                                           max_tokens=new_tokens)
    latencies.append(time.perf_counter() - t)
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": f"You see room {k}."}]
with open(os.environ["TRL_MULTITURN_RESULT"], "w") as f:
    json.dump({"reward": 1.0, "info": {"latencies": latencies}}, f)
