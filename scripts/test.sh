#!/usr/bin/env bash
# Set up, then run the whole test suite (offline; tiny models built in-process; the README says how long it took).
# SKIP_SETUP=1: .venv is set up already (.ci/run sets it up first).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_SETUP:-}" = 1 ] || bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
# --durations: every CI log ends with the 30 slowest test phases, where to look first when the suite's time grows.
"${VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider --durations=30 "$@"
# The trainer tests once more on the oldest supported TRL (1.14), when the whole suite ran.
if [ $# -eq 0 ]; then
  bash scripts/test_trl_oldest.sh
fi
