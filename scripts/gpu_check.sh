#!/usr/bin/env bash
# The checks kept for a machine with CUDA GPUs (CI has none): PPO's critic under DDP, FSDP2 and DeepSpeed ZeRO-2/3
# on CUDA (NCCL, one process per GPU, or TEST_NPROC), with the assertions the CPU runs of
# tests/trainers/test_distributed.py make: the critic trains as under DDP, its checkpoints hold whole weights, and a
# resumed run ends where the uninterrupted one did. On one GPU the runs have one process each: that checks the CUDA
# code paths (DeepSpeed's CUDA engine, NCCL, bf16-capable kernels), not the sharding, which the CPU runs check with 2
# processes.
#
# First, the GPU column of the model-family matrix (docs/models.md; scripts/model_matrix.py): every family of
# trl_multiturn/model_families.py built in-process (no Hub), each path checked against the rows' own forwards on CUDA,
# in float32 (verdicts: exact / refused / not supported, as on CPU) with SDPA, and with flash attention 2 where it
# is installed (packing refuses it: padded, exact); then in bf16, where the table shows the differences measured
# (bf16 kernels agree to bf16's precision only, so no verdict). The hybrid families' fast kernels
# (flash-linear-attention, mamba-ssm, causal-conv1d) are used by transformers where installed; the script prints
# which are. NOT YET RUN ON A GPU: written and dry-run on CPU only (tests/trainers/test_model_matrix.py).
#
#   bash scripts/gpu_check.sh --download   # here, with network: wheels the GPU machine may lack, into .whl/
#   bash scripts/gpu_check.sh              # there: installs .whl/ if present, then runs the checks (~3 min)
#   MATRIX=0 bash scripts/gpu_check.sh     # the PPO checks only
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WHEELS=(trl==1.16.0 deepspeed==0.19.8 hjson==3.1.0 ninja py-cpuinfo msgpack einops datasets dill multiprocess xxhash
        hypothesis sortedcontainers peft==0.21.2)
if [ "${1:-}" = --download ]; then
  "$PY" -m pip download -q --no-deps -d .whl "${WHEELS[@]}"
  exit
fi
if [ -d .whl ]; then
  DS_BUILD_OPS=0 "$PY" -m pip install -q --no-index --find-links .whl --no-deps .whl/*
fi
nvidia-smi -L
"$PY" -c "import torch, deepspeed, trl, transformers, accelerate; assert torch.cuda.is_available(); \
print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'trl', trl.__version__, \
'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
export TEST_NPROC=${TEST_NPROC:-$(nvidia-smi -L | wc -l)} HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 PYTHONPATH=$PWD
if [ "${MATRIX:-1}" = 1 ]; then
  ATTN=(sdpa)
  "$PY" -c "import flash_attn" 2>/dev/null && ATTN+=(flash_attention_2)
  "$PY" - <<'KERNELS'
import importlib.util
print("hybrid kernels:", {name: importlib.util.find_spec(name) is not None
                          for name in ("fla", "mamba_ssm", "causal_conv1d")})
KERNELS
  "$PY" scripts/model_matrix.py --device cuda --dtype float32 bfloat16 --attn "${ATTN[@]}" || MATRIX_WRONG=1
fi
"$PY" -m pytest -q -p no:cacheprovider tests/trainers/test_distributed.py -k ppo "$@"
exit "${MATRIX_WRONG:-0}"  # a WRONG cell of the matrix (listed on stderr above) fails the check
