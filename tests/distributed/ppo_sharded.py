"""Run under `torchrun --nproc_per_node 2`: two PPO steps with the policy and the critic sharded by FSDP2 (argv
`fsdp`), by DeepSpeed ZeRO-2 or ZeRO-3 (`zero2`, `zero3`; DeepSpeed's CPU accelerator, gloo) or replicated by DDP
(`ddp`), a checkpoint after each, then a run resumed from the first checkpoint; `stepwise` after the mode trains
step-wise (`episode_format="stepwise"`, 4 step rows per rank). Rank 0
writes what the test checks: which of the critic's saved weights moved, their shapes (whole, not one shard), whether
the resumed run ends with the critic the uninterrupted run saved, the gradient norms (one norm over policy and
critic, the one module the trainer trains), and the forwards of each plan the ranks agreed to pack."""

import json
import os
import sys
from pathlib import Path

import torch
from datasets import Dataset
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toy_envs import CountingEnv  # noqa: E402

from trl_multiturn import MultiTurnPPOConfig, MultiTurnPPOTrainer  # noqa: E402
from trl_multiturn.trainers.forwards import Forwards  # noqa: E402

PACKED = []  # (this rank's forwards, the forwards every rank runs) of each plan the ranks agreed to pack
agree = Forwards.agree


def recorded_agree(self, plan, error=None):
    """`Forwards.agree`, its packed plans recorded."""
    agreed = agree(self, plan, error)
    if agreed is not None:
        PACKED.append((len(plan.forwards), len(agreed.forwards)))
    return agreed


Forwards.agree = recorded_agree

model, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
STEPWISE = dict(episode_format="stepwise", steps_per_batch=4) if sys.argv[4:] == ["stepwise"] else {}


def fsdp_on_cpu() -> None:
    """accelerate turns FSDP on only for accelerator devices (CUDA, XPU, NPU, ...) and silently runs plain gloo DDP
    on CPU; torch's FSDP itself runs on CPU with gloo. Let its state take the FSDP plugin there too, so that the
    sharded code paths run here; everything else is accelerate's and TRL's own."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def init_with_fsdp(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type, self.fsdp_plugin = DistributedType.FSDP, fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # each new state copies it

    AcceleratorState.__init__ = init_with_fsdp


if mode == "fsdp" and not torch.cuda.is_available():
    fsdp_on_cpu()
if mode.startswith("zero") and not torch.cuda.is_available():
    # DeepSpeed's CPU backend compiles a shared-memory all-reduce with g++ when it starts (24-355 s on this machine,
    # again for each virtual environment's path) that only its inference_all_reduce uses: ZeRO's training reduces
    # through torch.distributed (gloo), which it falls back to without the op
    import deepspeed.comm.torch as deepspeed_comm

    deepspeed_comm.build_shm_op = lambda: None

ON_CPU = not torch.cuda.is_available()  # scripts/gpu_check.sh runs this on CUDA
BACKEND = {
    "ddp": dict(use_cpu=ON_CPU),
    "fsdp": dict(use_cpu=ON_CPU, fsdp=True,
                 fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}),
    # with `use_cpu`, accelerate's state takes gloo for the CPU processes and still enables DeepSpeed (without it, on
    # a machine with no accelerator, it finds no backend and counts one process while DeepSpeed's group spans two)
    **{f"zero{stage}": dict(use_cpu=ON_CPU, deepspeed={
        "zero_optimization": {"stage": stage, **({"stage3_gather_16bit_weights_on_model_save": True}
                                                 if stage == 3 else {})},
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto"}) for stage in (2, 3)},
}[mode]


def run(folder, resume=None):
    args = MultiTurnPPOConfig(
        output_dir=str(out / folder), max_turns=2, num_generations=1, per_device_train_batch_size=2,
        max_completion_length=4, max_steps=2, learning_rate=1e-2, bf16=False, report_to="none",
        save_strategy="steps", save_steps=1, shuffle_dataset=False, seed=0, reward_mode="dense",
        action_parser="trl_multiturn.rollout.parsing:whole_reply", logging_steps=1, **BACKEND, **STEPWISE,
    )
    trainer = MultiTurnPPOTrainer(model=model, args=args, environment_factory=CountingEnv,
                                  train_dataset=Dataset.from_list([{"target": 2}] * 4))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def critic(folder, step):
    return load_file(str(out / folder / f"checkpoint-{step}" / "critic" / "model.safetensors"))


trainer = run("straight")
rank = trainer.accelerator.process_index
grad_norms = [log["grad_norm"] for log in trainer.state.log_history if "grad_norm" in log]
trainer.accelerator.wait_for_everyone()
run("resumed", resume=str(out / "straight" / "checkpoint-1"))
if rank == 0:
    first, last, resumed = critic("straight", 1), critic("straight", 2), critic("resumed", 2)
    (out / "result.json").write_text(json.dumps({
        "sharded": trainer.is_fsdp_enabled,
        # one engine, over the module that holds both models
        "deepspeed": (trainer.is_deepspeed_enabled and type(trainer.model_wrapped).__name__ == "DeepSpeedEngine"
                      and trainer.model_wrapped.module.critic is trainer.unwrapped_critic),
        "processes": trainer.accelerator.num_processes,
        "shapes": {k: list(v.shape) for k, v in last.items()},
        "moved": [k for k in last if not torch.equal(first[k], last[k])],
        "resumed_equal": all(torch.allclose(last[k], resumed[k], atol=1e-6) for k in last),
        "grad_norms": grad_norms,
        "packed": PACKED,
        "step_rows": None if trainer.last_rollout.steps is None else len(trainer.last_rollout.steps),
    }))
trainer.accelerator.wait_for_everyone()
trainer.accelerator.end_training()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skip interpreter finalisation, as tests/distributed/equal_generate_calls.py explains
