#!/usr/bin/env bash
# Set up .venv-vllm (vLLM's CPU build; see scripts/setup_vllm.sh), then run the vLLM suite in tests_vllm/: the
# multi-turn GRPO, RLOO and PPO trainers with use_vllm=True, vllm_mode="colocate" on the offline SmolLM2-135M-Instruct
# and real TextWorld games, and a few families of docs/models.md's vLLM column re-measured
# (tests_vllm/test_model_matrix_vllm.py). Offline; CPU. SKIP_SETUP=1: .venv-vllm is set up already (.ci/run sets it up
# beforehand).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_SETUP:-}" = 1 ] || bash scripts/setup_vllm.sh
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
# One pytest process per trainer: the modules of one trainer (tests_vllm/test_<trainer>[_*].py: GRPO's and step-wise
# GRPO's) share a process and its vLLM engine, built and warmed up once (GRPO's two: 152 s and 7.3 GB peak in one
# process at load average 3, where the last fresh-clone run took 126 s + 88 s in two, with a third GRPO step since
# dropped); the trainers apart, each engine freed when its process ends (four trainers in one process: 15.3 GB).
# Arguments go to every process's run (select with -k; a run with nothing selected is skipped). The first test of each
# trainer trains it (a module fixture): allow it more than the main suite's 600 s.
declare -A modules
for module in tests_vllm/test_*.py; do
  name=${module#tests_vllm/test_}
  modules[${name%%_*}]+="$module "
done
status=0
for trainer in $(printf '%s\n' "${!modules[@]}" | sort); do
  echo "== ${modules[$trainer]}"
  "${VENV:-.venv-vllm}/bin/python" -m pytest -q -p no:cacheprovider --timeout 1800 ${modules[$trainer]} "$@" || {
    code=$?
    [ "$code" -eq 5 ] || status=$code  # 5: no test selected in these modules
  }
done
exit "$status"
