"""Seconds per SWE-Gym episode of OpenAI's Codex CLI (npm `@openai/codex`, unmodified) run inside the episode's local
sandbox against the training endpoint (`trl_multiturn.agents.codex_cli`); not a test (it needs `codex` under /usr:
scripts/setup.sh, as root).

    nice -n 10 python benchmarks/codex_cli_episode.py --episodes 4 --parallel 2

A stand-in model (the tiny random model would spend minutes on Codex's ~17k-token context on CPU) answers each
episode's first call with a call of Codex's `exec_command` tool that edits the repository and its second with
"Done."; every episode is graded. Prints, per episode, its wall time, its model calls and their context lengths,
Codex's exit status and whether the graded patch holds the edit; then the median seconds per episode.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402

from trl_multiturn.agents import AgentRunner  # noqa: E402
from trl_multiturn.agents.codex_cli import codex_cli_environment  # noqa: E402
from trl_multiturn.envs.swegym import SWEGymConfig, load_tasks  # noqa: E402
from trl_multiturn.rollout.rules import EpisodeRules  # noqa: E402
from trl_multiturn.testing import build_tiny_model  # noqa: E402

EDIT = "echo touched > CODEX_WAS_HERE.txt && cat CODEX_WAS_HERE.txt"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=2, help="episodes played at once (one rollout each)")
    parser.add_argument("--task", default="rpn")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tempfile.mkdtemp(prefix="codex-"), template="chatml"))
    call = "<tool_call>\n" + json.dumps({"name": "exec_command", "arguments": {"cmd": EDIT}}) + "\n</tool_call>"
    replies = {text: tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
               for text in (call, "Done.")}
    contexts = []

    def generate(batch, max_new_tokens):
        contexts.extend(len(c) for c in batch)
        return [replies["Done." if "<tool_response>" in tokenizer.decode(c[-400:]) else call] for c in batch], None

    env_config = SWEGymConfig(repo_cache_dir=tempfile.mkdtemp(prefix="codex-repos-"), reward="dense")
    runner = AgentRunner(codex_cli_environment(env_config, codex_timeout=300, agent_timeout=600), tokenizer,
                         generate, EpisodeRules(max_turns=4, max_completion_length=200))
    task = next(iter(load_tasks([args.task])))
    seconds = []
    try:
        for _ in range(0, args.episodes, args.parallel):
            contexts.clear()
            start = time.perf_counter()
            episodes = runner([task] * args.parallel)
            wall = time.perf_counter() - start
            for ep in episodes:
                info = ep.turns[-1].info if ep.turns else {}
                graded = "CODEX_WAS_HERE" in info.get("patch", "")
                print(f"failed: {ep.failure}" if ep.failed else "played", f"codex exit: {info.get('codex_exit_code')}",
                      f"edit graded: {graded}", f"turns: {ep.num_turns}", sep="; ")
            print(f"{args.parallel} episodes at once: {wall:.1f} s; model calls: {len(contexts)}; "
                  f"context tokens: {contexts}", flush=True)
            seconds.append(wall)
    finally:
        runner.close()
    print(f"median seconds per round of {args.parallel} episodes: {statistics.median(seconds):.1f} "
          f"(load average {os.getloadavg()[0]:.1f})", file=sys.stdout)


if __name__ == "__main__":
    main()
