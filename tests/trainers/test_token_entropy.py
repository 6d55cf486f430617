"""The per-token entropy of every forward (`logprobs.token_logps_and_entropies`) against a float64 reference."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from trl.trainer.utils import entropy_from_logits

from trl_multiturn.trainers.logprobs import token_logps_and_entropies


def peaked_logits(vocab_size: int = 32768, seed: int = 0) -> torch.Tensor:
    """Float32 logits of a tiny random Llama with a trained model's vocabulary size and logit spread (std ~5: the
    random head scaled up), over two rows of 32 tokens."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         tie_word_embeddings=False, initializer_range=0.3))
    model.lm_head.weight.data *= 4.2
    with torch.no_grad():
        return model(input_ids=torch.randint(0, vocab_size, (2, 32))).logits.float()


def float64_entropy(logits: torch.Tensor) -> torch.Tensor:
    logps = torch.log_softmax(logits.double(), dim=-1)
    return -(logps.exp() * logps).sum(-1)


def test_entropy_is_as_exact_as_trls_against_float64():
    # Measured on this model: the unshifted logsumexp(z) - sum softmax(z) z was 7.7e-5 to 9.7e-5 off (three seeds),
    # TRL's entropy_from_logits 1.0e-5, the step's 9.6e-6.
    logits = peaked_logits()
    assert logits.std() > 4  # the regime where the cancellation shows
    reference = float64_entropy(logits)
    ids = torch.zeros(logits.shape[:-1], dtype=torch.long)
    _, entropies = token_logps_and_entropies(logits, ids, temperature=1.0, compute_entropy=True)
    ours = (entropies.double() - reference).abs().max().item()
    trls = (entropy_from_logits(logits).double() - reference).abs().max().item()
    assert ours < 3e-5, ours
    assert ours <= 1.5 * trls, (ours, trls)


def test_logps_are_the_float64_log_softmax_and_temperature_divides_the_logits():
    logits = peaked_logits(vocab_size=4096, seed=1)
    ids = torch.randint(0, 4096, logits.shape[:-1])
    logps, entropies = token_logps_and_entropies(logits, ids, temperature=0.7, compute_entropy=True)
    reference = torch.log_softmax(logits.double() / 0.7, dim=-1)
    assert torch.allclose(logps.double(), reference.gather(-1, ids.unsqueeze(-1)).squeeze(-1), atol=1e-5)
    assert torch.allclose(entropies.double(), float64_entropy(logits / 0.7), atol=1e-5)


def test_gradients_through_the_shift_are_the_log_softmax_gradients():
    logits = (torch.randn(2, 5, 50) * 5).requires_grad_()
    ids = torch.randint(0, 50, (2, 5))
    logps, entropies = token_logps_and_entropies(logits, ids, temperature=1.0, compute_entropy=True)
    (logps.sum() + entropies.sum()).backward()
    reference = logits.detach().clone().requires_grad_()
    logp_all = torch.log_softmax(reference, dim=-1)
    (logp_all.gather(-1, ids.unsqueeze(-1)).sum() - (logp_all.exp() * logp_all).sum()).backward()
    assert torch.allclose(logits.grad, reference.grad, atol=1e-5)
