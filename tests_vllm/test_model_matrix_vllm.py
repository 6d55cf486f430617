"""docs/models_vllm.json (docs/models.md's "vLLM (CPU)" column) is what vLLM measures now: a few families re-measured
with `scripts/model_matrix_vllm.py`, one engine process each. Llama is the trainers' own family; FAMILIES_CHECKED
holds it, Gemma 3 (sliding-window layers, served) and Nemotron-H (refused: vLLM has no CPU kernel for its
non-gated MLP activation)."""

import importlib.util
import json
from pathlib import Path

import pytest
import vllm

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("model_matrix_vllm", ROOT / "scripts" / "model_matrix_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()
RECORDED = json.loads(SCRIPT.RESULTS.read_text())
FAMILIES_CHECKED = ("Llama (SmolLM2)", "Gemma 3", "Nemotron-H")


def test_the_column_was_measured_with_this_vllm():
    assert RECORDED["vllm"] == vllm.__version__, "run `.venv-vllm/bin/python scripts/model_matrix_vllm.py --write`"
    assert RECORDED["atol"] == SCRIPT.ATOL


@pytest.mark.parametrize("name", FAMILIES_CHECKED)
def test_the_recorded_cell_is_what_vllm_does_now(name):
    recorded, cell = RECORDED["families"][name], SCRIPT.run(name)
    assert cell["verdict"] == recorded["verdict"], cell
    if cell["verdict"] == "exact":
        assert cell["error"] <= SCRIPT.ATOL
    else:
        assert cell["detail"] == recorded["detail"]
