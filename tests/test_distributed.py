"""Two CPU processes (torchrun, gloo): every rank makes the same number of generate calls per step; the PPO critic
trains sharded by FSDP2."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


PPO_SCRIPT = Path(__file__).parent / "distributed" / "ppo_sharded.py"


def run_ppo_two_ranks(model, out, mode):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", OMP_NUM_THREADS="1")
    out.mkdir()
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(PPO_SCRIPT), model, str(out), mode],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def test_the_ppo_critic_trains_sharded_by_fsdp2_as_it_does_under_ddp(tiny_chatml_model, tmp_path):
    """Two CPU processes: FSDP2 (through accelerate, on CPU by letting its state take the FSDP plugin there) and
    DDP train the same critic; FSDP's checkpoints hold whole weights and its optimizer state, so a resumed run ends
    where the uninterrupted one did."""
    import torch
    from safetensors.torch import load_file

    fsdp = run_ppo_two_ranks(tiny_chatml_model, tmp_path / "fsdp", "fsdp")
    ddp = run_ppo_two_ranks(tiny_chatml_model, tmp_path / "ddp", "ddp")
    assert fsdp["sharded"] and not ddp["sharded"]
    assert fsdp["shapes"] == ddp["shapes"] and fsdp["shapes"]["model.embed_tokens.weight"][0] > 500  # whole
    assert "score.weight" in fsdp["moved"] and len(fsdp["moved"]) == len(fsdp["shapes"])
    assert fsdp["resumed_equal"] and ddp["resumed_equal"]
    # the critic's gradient norm over all shards is the replicated one (a sum of per-shard norms would not be)
    assert fsdp["grad_norms"] == pytest.approx(ddp["grad_norms"], rel=1e-4)
    critics = [load_file(str(tmp_path / m / "straight" / "checkpoint-2" / "critic" / "model.safetensors"))
               for m in ("fsdp", "ddp")]
    assert all(torch.allclose(critics[0][k], critics[1][k], atol=1e-5) for k in critics[1])
