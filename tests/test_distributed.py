"""Two CPU processes (torchrun, gloo): every rank makes the same number of generate calls per step."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "distributed" / "equal_generate_calls.py"


def test_ranks_make_equal_generate_calls_when_their_episodes_end_at_different_turns(tiny_chatml_model, tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", OMP_NUM_THREADS="1")
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", str(SCRIPT), tiny_chatml_model, str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    # Rank 1's episodes need three turns; rank 0's end after one, yet it keeps calling (with nothing to generate).
    assert rank1 == [2, 2, 2]
    assert rank0 == [2, 0, 0]
