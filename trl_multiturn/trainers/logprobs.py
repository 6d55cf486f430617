"""Per-token log-probabilities from a model's logits: the one log-prob maths of every forward of a step (old,
reference, the loss's own, the packed and the padded path, PPO's policy-and-critic forward).

A leaf module: it imports torch only, so that `packing`, `forwards` and `step` all import it.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


def token_logps_and_entropies(logits: torch.Tensor, ids: torch.Tensor, temperature: float,
                              compute_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probability of `ids` under the softmax of `logits / temperature`, and optionally its entropy:

        log p_t = z_t[y_t] - logsumexp(z_t),    H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_t[v],
        z_t = logits_t / T - max_v logits_t[v] / T

    `logits` (B, T, V) predict `ids` (B, T); computed in float32. Both are invariant to the shift by the row's
    maximum, which keeps the entropy's two terms small: unshifted, a 32k-token row of logits with std 5 loses ~1e-4
    to their cancellation; shifted, the entropy is as exact as TRL's `entropy_from_logits` (~1e-5, against a
    float64 reference: tests/trainers/test_token_entropy.py). The shift is a constant to autograd, so the
    gradients are those of the formula above."""
    z = logits.float() / temperature
    z = z - z.detach().amax(dim=-1, keepdim=True)
    normaliser = torch.logsumexp(z, dim=-1)
    logps = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - normaliser
    entropies = normaliser - (torch.softmax(z, dim=-1) * z).sum(-1) if compute_entropy else None
    return logps, entropies


def sequence_logps(model, input_ids, attention_mask, logits_to_keep: int, *, temperature: float,
                   batch_size: int | None = None, compute_entropy: bool = False, compute_aux_loss: bool = False,
                   autocast=None):
    """(log-probs (B, logits_to_keep), entropies or None, aux loss or None) of the last `logits_to_keep` tokens of
    each row under `model` (rows left-padded prompt then right-padded completion, as TRL lays them out; 0 at padding),
    `batch_size` rows per forward. The model computes logits for those positions only (`logits_to_keep`)."""
    batch_size = batch_size or input_ids.size(0)
    logps, entropies, aux = [], [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start: start + batch_size], attention_mask[start: start + batch_size]
        kwargs = {"output_router_logits": True} if compute_aux_loss else {}
        with autocast() if autocast is not None else nullcontext():
            out = model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1, use_cache=False,
                        **kwargs)
        lp, ent = token_logps_and_entropies(out.logits[:, -logits_to_keep - 1:-1], ids[:, -logits_to_keep:],
                                            temperature, compute_entropy)
        padding = mask[:, -logits_to_keep:] == 0  # 0 there, as TRL's own function gives
        logps.append(lp.masked_fill(padding, 0.0))
        entropies.append(ent.masked_fill(padding, 0.0) if compute_entropy else None)
        if compute_aux_loss:
            aux.append(out.aux_loss)
    return (torch.cat(logps), torch.cat(entropies) if compute_entropy else None,
            torch.stack(aux).mean() if compute_aux_loss else None)
