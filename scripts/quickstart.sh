#!/usr/bin/env bash
# The main job: set up, then (1) an SFT warm start of the offline default model (SmolLM2-135M-Instruct) on the
# walkthroughs of TextWorld games generated here, and (2) DAgger from it: the model plays, TextWorld's expert labels
# every state it reaches, the model trains on those states; it ends with greedy success on held-out games, printed
# beside the SFT start's. CPU, offline (the README says how long it took, and where). Step 2 is DAgger because it beat
# more SFT on walkthroughs in docs/study_learning_signal.md; GRPO from the same start is
# `trl-multiturn train grpo --config quickstart`. Extra arguments go to the DAgger step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
# One PyTorch thread unless you say otherwise: on cores busy with other work, a second thread made the same generate
# calls ten times slower (36.8 s against 393.8 s), and the examples never use more threads than OMP_NUM_THREADS.
# On quiet cores, OMP_NUM_THREADS=2 bash scripts/quickstart.sh is faster.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
PY="${VENV:-.venv}/bin/python"
"$PY" examples/textworld_sft.py --config recipes/quickstart_sft.yaml
"$PY" examples/textworld_dagger.py --config recipes/quickstart_dagger.yaml "$@"
