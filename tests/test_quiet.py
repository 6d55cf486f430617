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
