"""A critic module for a Qwen3.5-shaped policy (Gated DeltaNet layers), for the tests of PPO by forked layer states
(tests/trainers/test_ppo_packing.py, tests/distributed/packed_ranks.py)."""

import torch


def qwen35_critic(policy):
    """A critic for a Qwen3.5 policy, which transformers gives no token-classification class: the class it builds for
    other families (`GenericForTokenClassification`) over Qwen3.5's model, from the policy's config (fresh weights,
    seeded), passed to PPO as a `value_model=` module would be; its head random (a new one would value every state
    at 0), its dropout off (as the trainer turns it off)."""
    from transformers.modeling_layers import GenericForTokenClassification
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5PreTrainedModel

    critic_class = type("Qwen3_5ForTokenClassification", (GenericForTokenClassification, Qwen3_5PreTrainedModel), {})
    config = policy.config.__class__.from_dict({**policy.config.to_dict(), "num_labels": 1})
    torch.manual_seed(2)
    critic = critic_class(config).eval()
    torch.nn.init.normal_(critic.score.weight, std=0.5)
    return critic
