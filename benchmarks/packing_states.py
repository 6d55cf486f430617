"""Prefix sharing by forked layer states (trl_multiturn/trainers/packing_states.py) against padded rows, for the
families whose layers run over the sequence as a stream; not a test.

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/packing_states.py [FAMILY ...]
                                              # the table in benchmarks/results/packing_states.md

Models: the conformance matrix's tiny configs (trl_multiturn/model_families.py) widened to hidden size 256
(intermediate 512), fp32, in training mode, on CPU with transformers' torch reference kernels (no fla, mamba_ssm or
causal_conv1d). Rows (random tokens): (GRPO) two groups of 8 replies of 64 tokens to prompts of 512 and 480 tokens;
(step-wise) one episode's 8 rows with the full history, a 128-token start, 48-token replies, 16-token observations;
(unshared) 16 rows sharing nothing, prompts of 16 different lengths: the worst case, a forward per row.
Per path: one forward of the rows' log-probs and entropies and its backward, `batch_size=4` rows' tokens per forward,
wall seconds, the best of 3 after one warm-up, the two paths run in turn.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trl_multiturn.model_families import build_model, family  # noqa: E402
from trl_multiturn.trainers.logprobs import sequence_logps  # noqa: E402
from trl_multiturn.trainers.model_matrix import _batch  # noqa: E402
from trl_multiturn.trainers.packing_states import forked_logps_and_entropies  # noqa: E402

FAMILIES = ("Qwen3.5", "Nemotron-H", "LFM2")


def shapes(vocab: int, rng: random.Random) -> dict[str, list[tuple[list[int], list[int]]]]:
    def tokens(n):
        return [rng.randrange(vocab // 4, vocab) for _ in range(n)]

    context, stepwise = tokens(128), []
    for _ in range(8):
        reply = tokens(48)
        stepwise.append((list(context), reply))
        context += reply + tokens(16)
    return {"GRPO: 2 groups x 8 replies of 64, prompts 512/480": [(p, tokens(64)) for p in (tokens(512), tokens(480))
                                                                  for _ in range(8)],
            "step-wise: 8 rows, full history": stepwise,
            "unshared: 16 rows, prompts 449-512, replies 64": [(tokens(512 - 4 * i), tokens(64)) for i in range(16)]}


def best_times(steps, repeats: int = 3) -> list[float]:
    """The best of `repeats` wall times of each of `steps`, run in turn (so that a busy machine's load falls on
    both paths alike), after one warm-up of each."""
    times = [[] for _ in steps]
    for repeat in range(repeats + 1):
        for step, measured in zip(steps, times, strict=True):
            start = time.perf_counter()
            step()
            if repeat:
                measured.append(time.perf_counter() - start)
    return [min(measured) for measured in times]


def main() -> None:
    print("| family | rows | padded (s) | forked states (s) | speed-up |\n| --- | --- | --- | --- | --- |")
    for name in sys.argv[1:] or FAMILIES:
        model = build_model(family(name), hidden_size=256, intermediate_size=512).train()
        for shape, rows in shapes(model.config.vocab_size, random.Random(0)).items():
            ids, mask, keep = _batch(rows, "cpu")

            def step(forward):
                logps, entropies = forward()
                (logps.sum() + entropies.sum()).backward()
                model.zero_grad()

            padded, forked = best_times([
                lambda: step(lambda: sequence_logps(model, ids, mask, keep, temperature=1.0, batch_size=4,
                                                    compute_entropy=True)[:2]),
                lambda: step(lambda: forked_logps_and_entropies(model, ids, mask, keep, 4, True, temperature=1.0))])
            print(f"| {name} | {shape} | {padded:.2f} | {forked:.2f} | {padded / forked:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
