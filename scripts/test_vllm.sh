#!/usr/bin/env bash
# Set up .venv-vllm (vLLM's CPU build; see scripts/setup_vllm.sh), then run the vLLM suite in tests_vllm/: the
# multi-turn GRPO, RLOO and PPO trainers with use_vllm=True, vllm_mode="colocate" on the offline SmolLM2-135M-Instruct
# and real TextWorld games, and a few families of docs/models.md's vLLM column re-measured
# (tests_vllm/test_model_matrix_vllm.py). Offline; CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_vllm.sh
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
# One pytest process per module: each trainer's module holds one trainer and one vLLM engine, freed when its process
# ends (the four trainers in one process peaked at 15.3 GB). Arguments go to every module's run (select with -k; a
# module with nothing selected is skipped). The first test of each trainer trains it (a module fixture): allow it more
# than the main suite's 600 s per test.
status=0
for module in tests_vllm/test_*.py; do
  echo "== $module"
  "${VENV:-.venv-vllm}/bin/python" -m pytest -q -p no:cacheprovider --timeout 1800 "$module" "$@" || {
    code=$?
    [ "$code" -eq 5 ] || status=$code  # 5: no test selected in this module
  }
done
exit "$status"
