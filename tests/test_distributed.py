"""Two CPU processes (torchrun, gloo): every rank makes the same number of generate calls per step."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "distributed" / "equal_generate_calls.py"


def run_two_ranks(model, tmp_path, *extra):
    """Each rank's list of generate-call sizes from one training step of `equal_generate_calls.py`."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", OMP_NUM_THREADS="1")
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", str(SCRIPT), model, str(tmp_path), *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_ranks_make_equal_generate_calls_when_their_episodes_end_at_different_turns(tiny_chatml_model, tmp_path):
    rank0, rank1 = run_two_ranks(tiny_chatml_model, tmp_path)
    # Rank 1's episodes need three turns; rank 0's end after one, yet it keeps calling (with nothing to generate).
    assert rank1 == [2, 2, 2]
    assert rank0 == [2, 0, 0]


def test_with_rollout_overlap_the_halves_alternate_and_ranks_still_make_equal_calls(tiny_chatml_model, tmp_path):
    rank0, rank1 = run_two_ranks(tiny_chatml_model, tmp_path, "overlap")
    # One episode per half: rank 1 alternates its halves for three turns each, then makes one call with nothing
    # left to generate while its second half's last step is under way; rank 0 keeps pace with empty calls.
    assert rank1 == [1, 1, 1, 1, 1, 1, 0]
    assert rank0 == [1, 1, 0, 0, 0, 0, 0]
