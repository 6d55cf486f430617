#!/usr/bin/env bash
# The trainer tests again on the oldest TRL release trl-multiturn supports (pyproject.toml: trl>=1.14,<1.17): GRPO,
# RLOO, PPO and SFT (a real train() each) and the TRL boundary tests, in .venv-trl-oldest, a virtual environment that
# holds TRL 1.14 and takes every other package from .venv (which scripts/setup.sh made; run it first).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
OLDEST=${OLDEST_VENV:-.venv-trl-oldest}
TRL_OLDEST="trl==1.14.0"
if [ ! -x "$OLDEST/bin/python" ]; then
  python3 -m venv "$OLDEST"
fi
main_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=$("$OLDEST/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# .venv's packages come after this venv's own (TRL 1.14), with their .pth files (the editable trl-multiturn)
echo "import site; site.addsitedir('$(realpath "$main_site")')" > "$site/trl_multiturn_main_venv.pth"
"$OLDEST/bin/python" -m pip install -q --no-deps "$TRL_OLDEST"
"$OLDEST/bin/python" -c "import trl; assert trl.__version__ == '${TRL_OLDEST#trl==}', trl.__version__; print('TRL', trl.__version__)"
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
"$OLDEST/bin/python" -m pytest -q -p no:cacheprovider tests/trainers/test_grpo.py tests/trainers/test_rloo.py \
  tests/trainers/test_ppo.py tests/trainers/test_sft.py tests/trainers/test_trl_boundary.py \
  tests/trainers/test_trl_compat.py "$@"
