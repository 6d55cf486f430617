#!/usr/bin/env bash
# Set up, then run the whole test suite (offline; tiny models built in-process; the README says how long it took).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
"${VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider "$@"
