"""bf16 autocast against fp32 on this CPU: seconds per training step (forward and backward) and per forward pass of
the offline default model (SmolLM2-135M-Instruct) on a batch of 2 x 400 tokens, the size of two ALFWorld episodes.
The best of 3 after a warm-up, for each. examples/alfworld_grpo.py turns bf16 on where the CPU has bf16
instructions (`cpu_has_native_bf16`); this measures what that buys.

    python benchmarks/cpu_bf16.py [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from measures import markdown_table  # noqa: E402


def seconds(fn, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from trl_multiturn.models import OFFLINE_DEFAULT_MODEL, resolve_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(OFFLINE_DEFAULT_MODEL))
    ids = torch.randint(0, 40000, (2, 400), generator=torch.Generator().manual_seed(0))

    def train_step(bf16: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad()

    def forward(bf16: bool):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(input_ids=ids)

    rows = []
    for name, fn in (("train step", train_step), ("forward", forward)):
        fp32, bf16 = seconds(lambda: fn(False)), seconds(lambda: fn(True))
        rows.append([name, f"{fp32:.2f}", f"{bf16:.2f}", f"{fp32 / bf16:.1f}x"])
    print(markdown_table([f"{args.threads} threads", "fp32 s", "bf16 autocast s", "speed-up"], rows))


if __name__ == "__main__":
    main()
