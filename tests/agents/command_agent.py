"""A command-line agent for the process-agent tests: reads its task from $TRL_MULTITURN_TASK, talks to the endpoint
through the `openai` client configured only by the environment (OPENAI_BASE_URL, OPENAI_API_KEY), and writes its
reward to $TRL_MULTITURN_RESULT. The task row's "mode" picks how it behaves (see test_agent_process.py)."""

import json
import os
import subprocess
import sys
import time

import openai

task = json.loads(open(os.environ["TRL_MULTITURN_TASK"]).read())
mode = task.get("mode", "ok")
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
messages = [{"role": "user", "content": task.get("goal", "Go.")}]
for k in range(task.get("turns", 2)):
    if mode == "anthropic":  # Anthropic's client, configured by ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY
        import anthropic

        reply = anthropic.Anthropic(max_retries=0).messages.create(
            model=os.environ["TRL_MULTITURN_MODEL"], messages=messages, max_tokens=16)
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                     {"role": "user", "content": f"Room {k}."}]
        continue
    reply = client.chat.completions.create(model=os.environ["TRL_MULTITURN_MODEL"], messages=messages)
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": f"Room {k}."}]
if mode in ("hang", "leave_child"):  # a child in the agent's process group, which outlives the agent itself
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(task["pid_file"], "w") as f:
        f.write(str(child.pid))
    if mode == "hang":  # a malformed request fails its episode at once; the agent then hangs until killed
        try:
            client.chat.completions.create(model=os.environ["TRL_MULTITURN_MODEL"], messages=[])
        except openai.BadRequestError:
            pass
        time.sleep(600)
if mode == "crash":
    print("x" * 200_000)  # more output than the runner keeps
    print("the harness crashed", file=sys.stderr)
    sys.exit(3)
if mode != "no_result":
    with open(os.environ["TRL_MULTITURN_RESULT"], "w") as f:
        json.dump({"reward": len(messages) / 10, "won": True}, f)
