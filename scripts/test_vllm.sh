#!/usr/bin/env bash
# Set up .venv-vllm (vLLM's CPU build; see scripts/setup_vllm.sh), then run the vLLM suite in tests_vllm/: the
# multi-turn GRPO, RLOO and PPO trainers with use_vllm=True, vllm_mode="colocate" on the offline SmolLM2-135M-Instruct
# and real TextWorld games. Offline; CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_vllm.sh
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
# The first test of each trainer trains it (a module fixture): allow it more than the main suite's 600 s per test.
"${VENV:-.venv-vllm}/bin/python" -m pytest -q -p no:cacheprovider --timeout 1800 tests_vllm "$@"
