"""Known third-party warnings (TRL 1.16 on transformers 5.2x: gradient checkpointing's old names; TRL's "All reward
functions returned None" for rows we leave unscored) are filtered when trl_multiturn is imported, and nothing else
is."""

import logging
import os
import subprocess
import sys

SCRIPT = """
import warnings
{imports}
from trl import GRPOConfig
with warnings.catch_warnings(record=True) as seen:
    GRPOConfig(output_dir={out!r}, use_cpu=True, bf16=False)
    warnings.warn("a warning about the user's own code", FutureWarning)
print(sorted(str(w.message)[:40] for w in seen))
"""


def _warnings_seen(tmp_path, imports: str) -> str:
    code = SCRIPT.format(imports=imports, out=str(tmp_path))
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_gradient_checkpointing_rename_is_quiet_and_other_warnings_still_show(tmp_path):
    without = _warnings_seen(tmp_path, "")
    assert "`gradient_checkpointing` is deprecated" in without  # TRL's config warns on its own default
    quiet = _warnings_seen(tmp_path, "import trl_multiturn")
    assert "gradient_checkpointing" not in quiet
    assert "a warning about the user's own code" in quiet


def test_trls_no_reward_log_is_dropped_only_for_rows_without_an_episode_return(caplog):
    """`'episode_return': None` marks our failed episodes and step-wise padding rows; any other row's log shows."""
    import trl_multiturn  # noqa: F401 - installs the filters

    theirs = "All reward functions returned None for the following kwargs:\n{'prompt': 'p', 'score': None}\n"
    ours = "[RANK 0] All reward functions returned None for the following kwargs:\n{'episode_return': None}\n"
    with caplog.at_level(logging.WARNING):
        for name in ("trl.trainer.grpo_trainer", "trl.trainer.rloo_trainer"):
            logging.getLogger(name).warning(theirs)
            logging.getLogger(name).warning(ours)
    assert [r.getMessage() for r in caplog.records] == [theirs, theirs]


def test_trls_is_gradient_checkpointing_read_is_quiet(tmp_path):
    """TRL reads the old property around every generation (`unwrap_model_for_generation`,
    `disable_gradient_checkpointing`); the same message raised from elsewhere (not transformers' property) shows."""
    code = """
import warnings
import tempfile
import trl_multiturn
from transformers import AutoModelForCausalLM
from trl.models.utils import disable_gradient_checkpointing
from trl_multiturn.testing import build_tiny_model
model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tempfile.mkdtemp()))
with warnings.catch_warnings(record=True) as seen:
    with disable_gradient_checkpointing(model):
        pass
    warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6 (user's own)", FutureWarning)
print([str(w.message) for w in seen])
"""
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("is_gradient_checkpointing") == 1 and "user's own" in done.stdout, done.stdout


def test_deepspeeds_cpu_note_is_dropped_and_its_other_warnings_show(caplog):
    import trl_multiturn  # noqa: F401 - installs the filters
    from trl_multiturn.quiet import DEEPSPEED_CPU_NOTE, DEEPSPEED_LOGGER

    logger = logging.getLogger(DEEPSPEED_LOGGER)
    logger.propagate = True  # DeepSpeed's own handler does not propagate; caplog listens at the root
    try:
        with caplog.at_level(logging.WARNING):
            logger.warning(DEEPSPEED_CPU_NOTE)
            logger.warning("ZeRO stage 3 needs a config")
    finally:
        logger.propagate = False
    messages = {r.getMessage() for r in caplog.records}
    assert "ZeRO stage 3 needs a config" in messages and DEEPSPEED_CPU_NOTE not in messages


def test_a_cpu_run_with_deepspeed_installed_prints_no_accelerator_note():
    """What every CPU run of the dev set-up printed: DeepSpeed's detection, reached through accelerate/transformers."""
    code = "import trl_multiturn\nfrom deepspeed.accelerator import get_accelerator\nprint(get_accelerator()._name)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("cpu") and "Setting accelerator to CPU" not in done.stdout + done.stderr
