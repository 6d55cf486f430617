"""The conformance matrix's vLLM column: can vLLM's CPU build serve each model family, and are its sampled ids and
log-probs those the trainer trains on? Run with vLLM's venv (scripts/setup_vllm.sh):

    .venv-vllm/bin/python scripts/model_matrix_vllm.py --write     # every family: writes docs/models_vllm.json
    .venv-vllm/bin/python scripts/model_matrix_vllm.py --families "Llama (SmolLM2)"   # print only (with --write:
                                                                         # update these families' cells)

Per family, in its own process (an engine that crashes takes only its family's cell down): the tiny random model of
`model_families` (float32, head size 32: `attention_sizes`) and its in-process tokenizer are saved to a temporary
directory, an engine is built on it as the trainer's colocated engine is on CPU (float32, `enforce_eager`, a
256-token context, the CPU weight shim of `trainers/vllm_cpu.py`), and `MAX_TOKENS` tokens are sampled at
temperature 1 for a one-message chat prompt with log-probs of the prompt and of each sampled token. A cell is

    exact          vLLM kept the prompt ids as sent, returned a log-prob for each id it sampled (the ids the trainer
                   trains on, as they are), and every log-prob (prompt and sampled tokens) is within `ATOL` of the
                   Hugging Face model's own float32 forward over the same ids
    differs        the ids are as above but a log-prob is further than `ATOL` from the model's forward
    not supported  vLLM did not build the engine or generate: its reason, in one line (where a kernel has no float32
                   version, with how far vLLM's log-probs are off in bfloat16)

`python scripts/model_matrix.py --write` renders the JSON as docs/models.md's "vLLM (CPU)" column, and
`tests_vllm/test_model_matrix_vllm.py` re-measures a few families against it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "models_vllm.json"
ATOL = 1e-3
"""Largest |log p_vLLM - log p_HF| that counts as exact: both in float32, differing in kernels and summation order
(vLLM's paged attention, fused norms, its own Mamba / convolution kernels); the tiny random models' logits are large
(initializer_range 0.2), so a few 1e-5 is the usual gap."""
MAX_TOKENS = 8
PROMPT = [{"role": "user", "content": "You are in a hall. Exits: south, east. Go north."}]

ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_CI_ENV": "1", "OMP_NUM_THREADS": "1",
       "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}
"""The engine's environment (as tests_vllm/conftest.py sets it): a 1 GiB KV cache, no compilation, one unpinned
OpenMP thread, the engine in the calling process (its errors reach the cell)."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def measure(name: str, dtype: str = "float32") -> dict:
    """One family's cell (this process builds one engine, computing in `dtype`; the model's own forward, the
    reference, is float32): {"verdict", "detail", "error"}."""
    os.environ.update(ENV)
    sys.path.insert(0, str(ROOT))
    import torch

    from trl_multiturn.model_families import build_model, build_tokenizer, family

    fam = family(name)
    tokenizer = build_tokenizer(fam)
    model = build_model(fam, tokenizer, **attention_sizes(fam))
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        try:
            completion, prompt_logps, sampled_logps = _sample(path, prompt_ids, dtype)
        except Exception as exc:  # noqa: BLE001 (vLLM's refusal is the cell)
            return {"verdict": "not supported", "detail": f"{type(exc).__name__}: {_one_line(exc)}"[:300],
                    "error": None}
    ids = prompt_ids + completion
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()
    hf = logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    vllm_logps = torch.tensor(prompt_logps + sampled_logps, dtype=torch.float64)
    error = (vllm_logps - hf).abs().max().item()
    if error > ATOL:
        return {"verdict": "differs", "detail": f"vLLM's log-probs are up to {error:.0e} off the model's forward "
                                                f"(tolerance {ATOL:g})", "error": error}
    return {"verdict": "exact", "detail": "", "error": error}


def attention_sizes(fam) -> dict:
    """Overrides of the matrix's tiny sizes for vLLM: its CPU attention takes head sizes of 32 and up (the matrix's
    are 16), so 2 heads of 32 (configs that derive the head size from hidden_size / heads get 32 too). Latent
    attention (DeepSeek-V3) sets its own head sizes: unchanged. Gated DeltaNet heads: 32 too (its CPU kernel takes
    multiples of 32)."""
    if "head_dim" in fam.options:
        return {}
    linear = {"linear_key_head_dim": 32, "linear_value_head_dim": 32} if "linear_key_head_dim" in fam.options else {}
    return {"head_dim": 32, "num_attention_heads": 2, "num_key_value_heads": 1, **linear}


def _sample(path: str, prompt_ids: list[int], dtype: str) -> tuple[list[int], list[float], list[float]]:
    """(sampled ids, log-probs of prompt_ids[1:], log-probs of the sampled ids) from a vLLM engine on `path`, built
    as the trainer's colocated engine is on CPU. Raises what vLLM raises, and AssertionError where the ids it
    returns are not the ones it was sent or the ones its log-probs are about."""
    import vllm.model_executor.layers.utils as vllm_layer_utils
    from vllm import LLM, SamplingParams

    from trl_multiturn.trainers.vllm_cpu import _keep_live_weight

    vllm_layer_utils.dispatch_cpu_unquantized_gemm = _keep_live_weight(vllm_layer_utils.dispatch_cpu_unquantized_gemm)
    llm = LLM(model=path, dtype=dtype, max_model_len=256, enforce_eager=True, seed=0,
              max_num_seqs=4, max_num_batched_tokens=256)
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=1.0, logprobs=0,
                            prompt_logprobs=0, seed=0)
    out = llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)[0]
    completion = list(out.outputs[0].token_ids)
    assert list(out.prompt_token_ids) == prompt_ids, "vLLM changed the prompt ids it was sent"
    assert len(completion) == MAX_TOKENS == len(out.outputs[0].logprobs), "vLLM returned fewer ids or log-probs"
    assert all(i in lp for i, lp in zip(completion, out.outputs[0].logprobs)), "a log-prob is not the sampled id's"
    prompt_logps = [out.prompt_logprobs[t][prompt_ids[t]].logprob for t in range(1, len(prompt_ids))]
    sampled_logps = [lp[i].logprob for i, lp in zip(completion, out.outputs[0].logprobs)]
    return completion, prompt_logps, sampled_logps


def run(name: str, timeout: float = 1800) -> dict:
    """`measure(name)` in a process of its own; a process that dies or hangs is the cell's "not supported". Where
    a kernel has no float32 version, the cell's detail adds what the engine does in bfloat16 (the trainer's engine
    dtype under `bf16=True`)."""
    cell = _run(name, "float32", timeout)
    if cell["verdict"] == "not supported" and "for 'Float'" in cell["detail"]:
        bf16 = _run(name, "bfloat16", timeout)
        cell["detail"] += (f"; in bfloat16 vLLM serves it, its log-probs up to {bf16['error']:.0e} off the model's "
                           "float32 forward" if bf16["error"] is not None else f"; in bfloat16: {bf16['detail']}")
    return cell


def _run(name: str, dtype: str, timeout: float) -> dict:
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--dtype", dtype], capture_output=True,
                              text=True,
                              timeout=timeout, env={**os.environ, **ENV})
    except subprocess.TimeoutExpired:
        return {"verdict": "not supported", "detail": f"the engine did not answer within {timeout:g} s",
                "error": None}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        cell = json.loads(lines[-1])
        # vLLM inspects an architecture in a subprocess and raises "failed to be inspected. Please check the
        # logs": the cause is the last error its registry logged
        causes = re.findall(r"registry\.py:\d+\] (\w+Error: .*)", proc.stdout + proc.stderr)  # vLLM logs to stdout
        if "failed to be inspected" in cell["detail"] and causes:
            cell["detail"] = f"vLLM could not load its model class: {_one_line(causes[-1])}"
        return cell
    last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
    return {"verdict": "not supported", "detail": f"the engine process died (exit {proc.returncode}): "
                                                  f"{_one_line(last[0])}"[:300], "error": None}


def versions() -> dict:
    import torch
    import transformers
    import vllm

    return {"vllm": vllm.__version__, "transformers": transformers.__version__, "torch": torch.__version__}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    parser.add_argument("--families", nargs="*", help="family names (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the per-family process
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)  # its engine's dtype
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.dtype)))
        return 0
    sys.path.insert(0, str(ROOT))
    from trl_multiturn.model_families import FAMILIES

    names = args.families or [fam.name for fam in FAMILIES]
    cells = {}
    if args.write and args.families:  # re-measure these families, keep the others' cells
        recorded = json.loads(RESULTS.read_text())
        if {k: recorded[k] for k in ("vllm", "transformers", "torch")} != versions():
            parser.error(f"{RESULTS.name} was measured with other versions: --write without --families")
        cells = recorded["families"]
    for name in names:
        cells[name] = run(name)
        print(f"{name}: {json.dumps(cells[name])}", flush=True)
    if args.write:
        cells = {fam.name: cells[fam.name] for fam in FAMILIES if fam.name in cells}  # the table's order
        RESULTS.write_text(json.dumps({"atol": ATOL, "max_tokens": MAX_TOKENS, **versions(), "families": cells},
                                      indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
