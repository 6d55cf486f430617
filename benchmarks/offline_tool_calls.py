"""Whether the offline default model calls tools: its replies to a tool task under its own chat template (SmolLM2's,
which drops `tools`) and under TRL's Qwen2.5 template (the same ChatML tokens, tools shown in the system turn), and
how many of them are tool calls TRL's `parse_response` reads; not a test.

    nice -n 10 python benchmarks/offline_tool_calls.py

8 prompts ("What is A + B? Use the add tool.", one `add` tool) x 4 samples each, temperature 1, 40 new tokens, seed 0.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import trl  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl.chat_template_utils import add_response_schema, parse_response  # noqa: E402

from trl_multiturn.models import offline_default_model  # noqa: E402

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
PAIRS = [(3, 4), (10, 32), (7, 8), (21, 5), (13, 13), (2, 99), (45, 6), (17, 3)]


def main() -> None:
    torch.manual_seed(0)
    path = offline_default_model()
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    for name in ("SmolLM2's own", "TRL's qwen2_5.jinja"):
        tokenizer = AutoTokenizer.from_pretrained(path)
        if name != "SmolLM2's own":
            tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
            add_response_schema(tokenizer)
        calls = replies = 0
        for a, b in PAIRS:
            ask = [{"role": "user", "content": f"What is {a} + {b}? Use the add tool."}]
            prompt = tokenizer.apply_chat_template(ask, tools=[ADD], add_generation_prompt=True, return_tensors="pt",
                                                   return_dict=True)
            out = model.generate(**prompt, do_sample=True, temperature=1.0, max_new_tokens=40, num_return_sequences=4,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
            for row in out:
                sampled = row[prompt["input_ids"].shape[1]:].tolist()
                replies += 1
                if name != "SmolLM2's own":
                    try:
                        calls += bool(parse_response(tokenizer, sampled).get("tool_calls"))
                    except Exception:  # noqa: BLE001 - a reply the parser cannot read is no tool call
                        pass
        print(f"{name} template: {calls}/{replies} replies are tool calls TRL parses; last reply: "
              f"{tokenizer.decode(sampled, skip_special_tokens=True)[:80]!r}")


if __name__ == "__main__":
    main()
