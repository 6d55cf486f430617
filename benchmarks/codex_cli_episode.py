"""One episode of OpenAI's Codex CLI (npm `@openai/codex`, unmodified) as a process agent against the training
endpoint, in the Responses dialect; not a test (it needs `codex` on PATH: `npm install -g @openai/codex`).

    HOME=$(mktemp -d) python benchmarks/codex_cli_episode.py

A stand-in model answers "Done." to every call (the tiny random model would take minutes on Codex's ~19k-token
context on CPU); prints whether the episode failed, its model calls, their context lengths and its wall time. Codex's
multi-agent and web-search tools are switched off: they are no function tools, which the endpoint refuses.
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402

from trl_multiturn.agents import AgentCommand, AgentEnvironment, AgentRunner  # noqa: E402
from trl_multiturn.rollout.rules import EpisodeRules  # noqa: E402
from trl_multiturn.testing import build_tiny_model  # noqa: E402

CODEX = ('exec codex exec --disable multi_agent -c web_search=\\"disabled\\" --skip-git-repo-check '
         '--sandbox read-only -c model_provider=trl -c "model_providers.trl={name=\\"trl\\", '
         'base_url=\\"$OPENAI_BASE_URL\\", env_key=\\"OPENAI_API_KEY\\", wire_api=\\"responses\\"}" '
         '-m "$TRL_MULTITURN_MODEL" "Say done."')


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tempfile.mkdtemp(prefix="codex-"), template="chatml"))
    reply = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    contexts = []

    def generate(batch, max_new_tokens):
        contexts.extend(len(c) for c in batch)
        return [reply for _ in batch], None

    runner = AgentRunner(AgentEnvironment(AgentCommand(["sh", "-c", CODEX], score=lambda task, run: 1.0),
                                          agent_timeout=300), tokenizer, generate,
                         EpisodeRules(max_turns=4, max_completion_length=16))
    start = time.perf_counter()
    try:
        (episode,) = runner([{}])
    finally:
        runner.close()
    print(f"failed: {episode.failure}" if episode.failed else "played", f"model calls: {len(contexts)}",
          f"context tokens: {contexts}", f"episode: {time.perf_counter() - start:.1f} s", sep="; ", file=sys.stdout)


if __name__ == "__main__":
    main()
