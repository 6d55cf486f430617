"""Two CPU processes (torchrun, gloo): every rank makes the same number of generate calls per step (agents in their
own processes included); each rank packs its own rows, running as many forwards as the other, with the gradients of
one process under DDP and FSDP2; the PPO critic trains sharded by FSDP2 and as its own DeepSpeed ZeRO-2/3 engine."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "distributed" / "equal_generate_calls.py"


def launch(script, *args, processes=2):
    """Run `script` (in tests/distributed/) under torchrun with `processes` CPU processes; fail with its stderr."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", str(processes), str(script), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def run_two_ranks(model, tmp_path, *extra):
    """Each rank's list of generate-call sizes from one training step of `equal_generate_calls.py`."""
    launch(SCRIPT, model, tmp_path, *extra)
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


def test_with_episode_scheduling_ranks_still_make_equal_calls(tiny_chatml_model, tmp_path):
    rank0, rank1 = run_two_ranks(tiny_chatml_model, tmp_path, "episode")
    # How rank 1's six replies group into calls depends on when its steps return; rank 0 pads with empty calls.
    assert len(rank0) == len(rank1) >= 3
    assert sum(rank1) == 6 and sum(rank0) == 2 and rank0[0] == 2 and set(rank0[1:]) == {0}


def test_stepwise_ranks_hand_trl_equal_rows_and_make_equal_calls(tiny_chatml_model, tmp_path):
    rank0, rank1 = run_two_ranks(tiny_chatml_model, tmp_path, "stepwise")
    assert rank1 == [2, 2, 2] and rank0 == [2, 0, 0]
    # steps_per_batch=4: rank 0 played 2 one-turn steps and pads 2 rows; rank 1 draws 4 of its 6 steps. Unequal row
    # counts would break TRL's gathers across ranks.
    rows = [json.loads((tmp_path / f"rank{r}_steps.json").read_text()) for r in (0, 1)]
    assert rows == [[4, 2], [4, 4]]


def test_command_line_agents_in_their_own_processes_train_on_two_ranks_with_equal_generate_calls(tiny_chatml_model,
                                                                                                tmp_path):
    rank0, rank1 = run_two_ranks(tiny_chatml_model, tmp_path, "agent")
    # Rank 0's two agent processes make one model call each, rank 1's three each; how the calls group depends on when
    # the processes' requests arrive, and each rank joins the other's generate calls with nothing to generate.
    assert len(rank0) == len(rank1) >= 3
    assert sum(rank1) == 6 and sum(rank0) == 2


@pytest.fixture(scope="module")
def packed_ranks(tiny_chatml_model, tmp_path_factory):
    """The folder of one run of tests/distributed/packed_ranks.py on two processes."""
    out = tmp_path_factory.mktemp("packed_ranks")
    launch(Path(__file__).resolve().parents[1] / "distributed" / "packed_ranks.py", tiny_chatml_model, out)
    return out


def test_each_rank_packs_its_own_rows_with_as_many_forwards_and_the_gradients_of_one_process(packed_ranks):
    """Rank 0's rows (one group sharing its prompt) pack into fewer forwards than rank 1's (rows sharing nothing): it
    runs filler forwards up to rank 1's number, and the loss, log-probs and gradients under DDP and under FSDP2 are
    those of one process over every rank's rows, padded (fp32)."""
    rank0, rank1 = (rank["packed"] for rank in json.loads((packed_ranks / "result.json").read_text()))
    for backend in (0, 1):
        first, second = rank0[backend], rank1[backend]
        assert first["planned"] == [1] and second["planned"] == [2]  # one plan each, rank 0's one forward short
        assert first["forwards"] == second["forwards"] == 2
        for result in (first, second):
            assert result["logps"] < 1e-4 and result["loss"] < 1e-4 and result["grads"] < 1e-4, result


def test_a_hybrid_model_forks_its_states_on_each_rank_with_as_many_forwards_and_one_process_gradients(packed_ranks):
    """Qwen3.5-shaped (Gated DeltaNet): rank 0's group forks into two forwards (its prompt, then the replies continued
    from the prompt's layer states), rank 1's unrelated rows into one, so rank 1 runs one filler forward; under DDP
    and under FSDP2 the log-probs, loss and gradients are one process's forked run over every rank's rows (fp32;
    gradients relative to their scale where it exceeds 1: this model's reach 12)."""
    rank0, rank1 = (rank["forked"] for rank in json.loads((packed_ranks / "result.json").read_text()))
    for backend in (0, 1):
        first, second = rank0[backend], rank1[backend]
        assert first["planned"] == [2] and second["planned"] == [1]
        assert first["forwards"] == second["forwards"] == 2  # rank 1: its one forward and a filler
        for result in (first, second):
            assert result["logps"] < 1e-4 and result["loss"] < 1e-4 and result["grads"] < 1e-4, result


def test_ppo_forks_a_hybrid_policy_and_critic_on_each_rank_with_as_many_forwards_and_one_process_gradients(
        packed_ranks):
    """PPO's loss forward of a Qwen3.5-shaped policy and critic under DDP: each rank plans its rows as the trainer
    does (forked forwards of both models, agreed: rank 0's group two, rank 1's rows one and a filler through both
    models), and the log-probs, values, loss and gradients of both models are one process's forked run over every
    rank's rows (fp32; gradients relative to their scale where it exceeds 1)."""
    rank0, rank1 = (rank["ppo"] for rank in json.loads((packed_ranks / "result.json").read_text()))
    assert rank0["plan"] == rank1["plan"] == "ForkPlan"
    assert rank0["planned"] == [2] and rank1["planned"] == [1]
    assert rank0["forwards"] == rank1["forwards"] == 2
    for result in (rank0, rank1):
        assert max(result[key] for key in ("logps", "values", "loss", "grads")) < 1e-4, result


def test_planning_that_fails_on_one_rank_raises_one_error_on_every_rank(packed_ranks):
    """A "prefix" refusal of rank 0's rows alone (longer than the model's sliding window, rank 1's shorter), a
    planner error on rank 1 alone, and a hybrid model's forked plan failing on rank 0 alone (its rows' mask has a
    hole): both ranks raise the same error, naming the failing rank, the field, its value and
    the fix, instead of the healthy rank waiting in the plan's collective (the script makes no collective after
    them, so a rank that did not raise would have run its forwards and recorded None)."""
    refusals = [json.loads((packed_ranks / f"refusals{r}.json").read_text()) for r in (0, 1)]
    (window, planner, forked), (window1, planner1, forked1) = refusals
    assert window == window1 and planner == planner1 and forked == forked1
    assert forked.startswith("ValueError: rank 0 of 2 could not plan its rows: ValueError: row 0: attention_mask has "
                             "holes"), forked
    assert window.startswith("ValueError: rank 0 of 2 could not plan its rows: ValueError: packing='prefix': ")
    assert "sliding_window=24" in window and "use packing='padded'" in window and "rank 1" not in window
    assert planner == "RuntimeError: rank 1 of 2 could not plan its rows: RuntimeError: no plan on rank 1"


PPO_SCRIPT = Path(__file__).resolve().parents[1] / "distributed" / "ppo_sharded.py"
PPO_PROCESSES = int(os.environ.get("TEST_NPROC", "2"))
"""Processes of the PPO runs: 2 on CPU; scripts/gpu_check.sh sets one per GPU (CUDA then replaces the CPU)."""


def run_ppo_two_ranks(model, out, mode, *extra):
    out.mkdir()
    launch(PPO_SCRIPT, model, out, mode, *extra, processes=PPO_PROCESSES)
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def ddp_ppo_run(tiny_chatml_model, tmp_path_factory):
    """The reference: the same two PPO steps with policy and critic replicated by DDP (and its resumed run)."""
    out = tmp_path_factory.mktemp("ppo") / "ddp"
    return run_ppo_two_ranks(tiny_chatml_model, out, "ddp"), out


def assert_trains_the_critic_ddp_does(run, out, ddp_ppo_run):
    """`run` (written to `out`) saved whole critics that moved in every weight, resumed to where it ended, and
    trained the critic DDP trains: the same gradient norms (over all shards: a sum of per-shard norms would differ)
    and the same weights after two steps."""
    import torch
    from safetensors.torch import load_file

    ddp, ddp_out = ddp_ppo_run
    assert not ddp["sharded"] and ddp["resumed_equal"]
    assert run["processes"] == PPO_PROCESSES
    assert run["shapes"] == ddp["shapes"] and run["shapes"]["model.embed_tokens.weight"][0] > 500  # whole
    assert "score.weight" in run["moved"] and len(run["moved"]) == len(run["shapes"])
    assert run["resumed_equal"]
    assert ddp["packed"] and run["packed"] == ddp["packed"]  # each rank packed its rows, the same plans
    assert run["grad_norms"] == pytest.approx(ddp["grad_norms"], rel=1e-4)
    critics = [load_file(str(folder / "straight" / "checkpoint-2" / "critic" / "model.safetensors"))
               for folder in (out, ddp_out)]
    assert all(torch.allclose(critics[0][k], critics[1][k], atol=1e-5) for k in critics[1])


def test_the_ppo_critic_trains_sharded_by_fsdp2_as_it_does_under_ddp(tiny_chatml_model, tmp_path, ddp_ppo_run):
    """Two CPU processes: FSDP2 (through accelerate, on CPU by letting its state take the FSDP plugin there) and
    DDP train the same critic; FSDP's checkpoints hold whole weights and its optimizer state, so a resumed run ends
    where the uninterrupted one did."""
    fsdp = run_ppo_two_ranks(tiny_chatml_model, tmp_path / "fsdp", "fsdp")
    assert fsdp["sharded"]
    assert_trains_the_critic_ddp_does(fsdp, tmp_path / "fsdp", ddp_ppo_run)


@pytest.mark.parametrize("stage", [2, 3])
def test_the_ppo_critic_trains_in_one_deepspeed_engine_with_the_policy_as_under_ddp(tiny_chatml_model, tmp_path,
                                                                                   ddp_ppo_run, stage):
    """Two CPU processes, DeepSpeed's CPU accelerator (gloo): under ZeRO-2 and ZeRO-3 one engine holds policy and
    critic (one optimizer) and trains the critic as DDP does; that engine's checkpoint resumes it."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (scripts/setup.sh installs it)")
    run = run_ppo_two_ranks(tiny_chatml_model, tmp_path / f"zero{stage}", f"zero{stage}")
    assert run["deepspeed"] and not run["sharded"]
    assert (tmp_path / f"zero{stage}" / "straight" / "checkpoint-1" / "latest").is_file()
    assert_trains_the_critic_ddp_does(run, tmp_path / f"zero{stage}", ddp_ppo_run)


def test_stepwise_ppo_trains_its_critic_and_resumes_on_two_ranks(tiny_chatml_model, tmp_path):
    """Step-wise PPO under DDP: each rank hands TRL its step rows (steps_per_batch), the critic values them and
    moves in every weight, and a run resumed from the first checkpoint ends where the uninterrupted one did."""
    run = run_ppo_two_ranks(tiny_chatml_model, tmp_path / "stepwise", "ddp", "stepwise")
    assert run["processes"] == PPO_PROCESSES and not run["sharded"]
    assert "score.weight" in run["moved"] and len(run["moved"]) == len(run["shapes"])
    assert run["resumed_equal"] and len(run["grad_norms"]) == 2
    assert run["step_rows"] == 4  # steps_per_batch step rows on rank 0, not its 2 episodes
