"""Common model set-ups from a recipe or the command line: TRL's `ModelConfig` (dtype, attention, LoRA, 4/8-bit).

The examples and `trl-multiturn train` parse `ModelSetup` beside their script arguments and trainer config, and pass
it on as TRL's own scripts (`trl/scripts/grpo.py`) do: `dtype`, `attn_implementation` and `model_revision` become
the config's `model_init_kwargs` (values already there win), `get_quantization_config` gives the trainer's
`quantization_config` and `get_peft_config` its `peft_config`:

    trl-multiturn train grpo --config recipes/quickstart.yaml --use_peft --lora_r 8 --dtype bfloat16
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from trl import ModelConfig

from .config_checks import Range, check_fields, config_field

logger = logging.getLogger(__name__)


@dataclass
class ModelSetup(ModelConfig):
    """TRL's `ModelConfig`, less `model_name_or_path`, which the script arguments already hold (with the offline
    default), plus `torch_dtype`, the name of `dtype` before transformers 5, and `cpu_threads`."""


    model_name_or_path: str | None = field(
        default=None, init=False, metadata={"help": "Not parsed here: the script arguments' --model_name_or_path."}
    )
    torch_dtype: str | None = field(
        default=None,
        metadata={"help": "Same as `dtype` (its name in older TRL and transformers); when given, it wins.",
                  "choices": ["auto", "bfloat16", "float16", "float32"]},
    )
    cpu_threads: int | None = config_field(
        None, "PyTorch threads per process on a run without a GPU. None: the cores this process may use, shared "
              "among the processes on this machine, and never more than OMP_NUM_THREADS when it is set (on a "
              "machine busy with other work, 1 thread is often several times faster than 2: set OMP_NUM_THREADS=1 "
              "or --cpu_threads 1; `accelerate launch` sets OMP_NUM_THREADS=1 on a machine with no GPU unless given "
              "--num_cpu_threads_per_process); N: N threads. Ignored on a GPU.", range=Range(ge=1))

    def __post_init__(self):
        check_fields(self)
        super().__post_init__()
        if self.torch_dtype is not None:
            self.dtype = self.torch_dtype


def cpu_threads(requested: int | None) -> int:
    """The PyTorch threads of a run without a GPU: `requested`, or by default the cores this process may use divided
    among the processes a launcher started on this machine (`LOCAL_WORLD_SIZE`), at most `OMP_NUM_THREADS` when that
    is set to a positive number, and at least 1."""
    if requested is not None:
        return requested
    threads = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    return min(threads, int(omp)) if omp.isdigit() and int(omp) > 0 else threads


def set_cpu_threads(requested: int | None) -> None:
    """Set PyTorch's thread count to `cpu_threads(requested)` (call it on a run without a GPU)."""
    import torch

    threads = cpu_threads(requested)
    if threads != torch.get_num_threads():
        logger.info("PyTorch threads: %d -> %d (--cpu_threads sets it)", torch.get_num_threads(), threads)
        torch.set_num_threads(threads)


def model_setup_kwargs(model_args: ModelConfig | None, training_args) -> dict:
    """The trainer keyword arguments `model_args` asks for (`quantization_config`, `peft_config`), after setting
    `training_args.model_init_kwargs` from it as TRL's scripts do (keys the config already has are kept), and, on a
    run without a GPU, PyTorch's thread count (`ModelSetup.cpu_threads`). Empty for None."""
    if model_args is None:
        return {}
    import torch

    if training_args.use_cpu or not torch.cuda.is_available():
        set_cpu_threads(getattr(model_args, "cpu_threads", None))
    from trl import get_peft_config, get_quantization_config

    init_kwargs = dict(revision=model_args.model_revision, attn_implementation=model_args.attn_implementation,
                       dtype=model_args.dtype)
    training_args.model_init_kwargs = {**init_kwargs, **(training_args.model_init_kwargs or {})}
    return {"quantization_config": get_quantization_config(model_args), "peft_config": get_peft_config(model_args)}
