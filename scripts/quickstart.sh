#!/usr/bin/env bash
# The main job: set up, then a short multi-turn GRPO run on TextWorld games generated here, with the offline
# default model (SmolLM2-135M-Instruct), ending with greedy success on held-out games. CPU, offline, minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1
"${VENV:-.venv}/bin/python" examples/textworld_grpo.py --config recipes/quickstart.yaml "$@"
