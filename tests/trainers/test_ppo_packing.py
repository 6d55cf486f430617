"""PPO through prefix-tree packing (trl_multiturn/trainers/packing.py): the loss's one forward of policy and critic
and the critic's value passes (the rows', and step-wise the steps `steps_per_batch` leaves out) give, packed, the
log-probs, entropies, values, losses and gradients of the padded rows, in fp32; a hybrid policy and critic
(Qwen3.5-shaped) give them by forked layer states (trl_multiturn/trainers/packing_states.py)."""

import random

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from test_packing import ATOL, TEMPERATURE, assert_same_loss_packed_or_padded, batch, grouped, load, stepwise, tokens
from toy_envs import CountingEnv
from transformers import AutoModelForTokenClassification

from trl_multiturn import MultiTurnPPOConfig, MultiTurnPPOTrainer
from trl_multiturn.model_families import build_critic, build_model, family
from trl_multiturn.trainers import forwards, ppo
from trl_multiturn.trainers.model_matrix import ATOL as MATRIX_ATOL
from trl_multiturn.trainers.packing import PackPlan, check_model_packing, choose_plan, packed_values, plan_packs
from trl_multiturn.trainers.packing_states import ForkPlan
from trl_multiturn.trainers.ppo import policy_and_values
from trl_multiturn.trainers.value_model import PolicyAndValueModel, create_value_model, token_values


def policy_and_critic(path, critic_attn="sdpa"):
    torch.manual_seed(1)
    critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, attn_implementation=critic_attn,
                                                             dtype=torch.float32)  # a random head: values not 0
    return PolicyAndValueModel(load(path), critic)


def failed_and_truncated(rng):
    """A full row, a truncated one (a prefix of it), a failed episode's one-token row ([pad] + [eos], as
    `RolloutBatch.token_lists` writes it) and an unrelated row."""
    prompt, reply = tokens(rng, 25), tokens(rng, 10)
    return [(prompt, reply), (prompt, reply[:4]), ([0], [2]), (tokens(rng, 7), tokens(rng, 3))]


ROWS = {
    "a group's shared prompt": lambda: grouped(random.Random(0)),
    "step-wise full history": lambda: stepwise(random.Random(1), "full"),
    "step-wise window:2": lambda: stepwise(random.Random(2), 2, turns=6),
    "failed and truncated rows": lambda: failed_and_truncated(random.Random(3)),
}


@pytest.mark.parametrize("shape", list(ROWS))
def test_the_loss_forward_of_policy_and_critic_packed_equals_padded(tiny_chatml_model, shape):
    """Log-probs, entropies and values of the loss's forward, and the gradients of both models after one backward
    of a loss over them, equal the padded forward's on every sampled column."""
    plan = assert_policy_and_values_exact(policy_and_critic(tiny_chatml_model), ROWS[shape]())
    if shape != "failed and truncated rows":
        assert plan.forwarded_tokens < plan.padded_tokens


def assert_policy_and_values_exact(model, rows, choose=plan_packs, atol=ATOL, grad_rtol=1e-4):
    """Packed (by `choose(ids, mask, keep)`'s plan) and padded `policy_and_values` of a `PolicyAndValueModel` agree on
    `rows` (log-probs, entropies, values, and the gradients of both models after one backward of a loss over them:
    within `atol` times each gradient's scale, and `grad_rtol`); returns the plan."""
    ids, mask, keep = batch(rows)
    plan = choose(ids, mask, keep)
    scored = mask[:, -keep:].bool()
    if isinstance(plan, PackPlan):
        assert plan.valid.equal(scored)  # the packed outputs cover exactly the completion tokens
    results = []
    for packed in (False, True):
        model.zero_grad()
        outputs = policy_and_values(model, ids, mask, keep, temperature=TEMPERATURE, plan=plan if packed else None)
        logps, entropies, values = (torch.where(scored, out, 0.0) for out in outputs)
        weights = torch.linspace(-1, 1, logps.numel()).view_as(logps)
        ((logps * weights).sum() + 0.1 * entropies.sum() + (values * weights.flip(1)).sum()).backward()
        results.append(([t.detach() for t in (logps, entropies, values)],
                        [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (padded, padded_grads), (packed, packed_grads) = results
    assert padded[2].abs().sum() > 0  # the critic's values are not all 0: the comparison has something to compare
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)
    assert len(packed_grads) == len(padded_grads) == sum(1 for _ in model.parameters())  # policy and critic
    for a, b in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, atol=atol * max(1.0, b.abs().max().item()), rtol=grad_rtol)
    return plan


def test_a_critic_the_packed_mask_cannot_reach_is_refused_by_name_or_padded(tiny_chatml_model):
    """Policy and critic share one packed mask: a critic of another attention implementation, or a module with no
    transformers config, is refused by name with "prefix" and padded with "auto"."""
    ids, mask, keep = batch(grouped(random.Random(4)))
    eager = policy_and_critic(tiny_chatml_model, critic_attn="eager")

    class Critic(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            raise AssertionError("not called")

    for critic, refusal in ((eager.critic, "the models' attn_implementation differ \\('sdpa', 'eager'\\)"),
                            (Critic(), "Critic has no transformers config")):
        models = (eager.policy, critic)
        with pytest.raises(ValueError, match=f"packing='prefix': {refusal}"):
            choose_plan(models, ids, mask, keep, packing="prefix")
        assert choose_plan(models, ids, mask, keep, packing="auto") is None
    # a critic built from a policy object takes its attention implementation: the two pack together
    critic = create_value_model(eager.policy)
    assert choose_plan((eager.policy, critic), ids, mask, keep, packing="prefix") is not None


@pytest.fixture(scope="module")
def hybrid_policy_and_critic():
    """A Qwen3.5 policy and the critic a user passes as `value_model=` (transformers has no token-classification
    class for Qwen3.5: `GenericForTokenClassification` over its model)."""
    policy = build_model(family("Qwen3.5")).train()
    return PolicyAndValueModel(policy, build_critic(policy))


@pytest.mark.parametrize("shape", ["a group's shared prompt", "step-wise full history", "failed and truncated rows"])
def test_a_hybrid_policy_and_critic_fork_their_layer_states_exactly(hybrid_policy_and_critic, shape):
    """Qwen3.5-shaped (Gated DeltaNet) policy and critic: "prefix" plans the loss's rows as forked forwards, each model
    continued from its own layer states, and the log-probs, entropies and values equal the padded forward's (fp32, max
    abs 1e-4), the gradients of both models too (1e-4 of each gradient's scale, relative 1e-3: the tolerance of the
    forked GRPO forwards, `model_matrix._grads_differ`; the Gated DeltaNet's chunked scan sums in float32 in another
    order from a forked state, the policy's gradients alone then 2e-4 off relative, as in GRPO's forked forwards);
    the critic's value pass alone equals its padded values."""
    model = hybrid_policy_and_critic
    plan = assert_policy_and_values_exact(
        model, ROWS[shape](), lambda ids, mask, keep: choose_plan((model.policy, model.critic), ids, mask, keep,
                                                                  packing="prefix"), atol=MATRIX_ATOL, grad_rtol=1e-3)
    assert isinstance(plan, ForkPlan)
    ids, mask, keep = batch(ROWS[shape]())
    with torch.no_grad():
        padded = token_values(model.critic, ids, mask, keep).masked_fill(~mask[:, -keep:].bool(), 0)
        torch.testing.assert_close(packed_values(model, plan), padded, atol=MATRIX_ATOL, rtol=0)


def test_a_critic_that_does_not_fork_beside_a_policy_that_does_is_refused_by_name_or_padded(hybrid_policy_and_critic):
    """One plan serves policy and critic: a Qwen3.5 policy (forked layer states) beside an attention-only critic
    (tree-mask packs), or the reverse, is refused by "prefix" naming both models and the fix, at the trainer's start
    and per batch, and padded by "auto"."""
    ids, mask, keep = batch(grouped(random.Random(4)))
    hybrid = hybrid_policy_and_critic.policy
    attention = build_model(family("Qwen3"))
    for policy, critic in ((hybrid, create_value_model(attention)), (attention, hybrid_policy_and_critic.critic)):
        refusal = (r"^packing='prefix': .*\(qwen3_5_text\) shares prefixes by forking its layer states and "
                   r".*\(qwen3\) does not.*pass `value_model=` a critic with the policy's kind of layers.*"
                   r"use packing='padded'$")
        with pytest.raises(ValueError, match=refusal):
            choose_plan((policy, critic), ids, mask, keep, packing="prefix")
        with pytest.raises(ValueError, match=refusal):
            check_model_packing(PolicyAndValueModel(policy, critic), "prefix")
        assert choose_plan((policy, critic), ids, mask, keep, packing="auto") is None


def make_trainer(path, tmp_path, packing, **overrides):
    overrides.setdefault("num_generations", 2)
    args = tiny_rl_args(MultiTurnPPOConfig, tmp_path, packing=packing, reward_mode="dense",
                        action_parser="trl_multiturn.rollout.parsing:whole_reply", **overrides)
    trainer = MultiTurnPPOTrainer(path, args=args, environment_factory=CountingEnv,
                                  train_dataset=Dataset.from_list([{"target": 2}, {"target": 3}] * 2))
    with torch.no_grad():  # a head at zero values every state at 0: the comparison would be weak
        trainer.unwrapped_critic.score.weight.normal_(std=0.5, generator=torch.Generator().manual_seed(0))
    return trainer


def count_packed_calls(monkeypatch) -> dict:
    """Counts the PPO trainer's packed forwards: the critic's value passes (`forwards.Forwards`) and the loss's."""
    calls = {"values": 0, "loss": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(forwards, "packed_values", counted("values", forwards.packed_values))
    monkeypatch.setattr(ppo, "packed_policy_and_values", counted("loss", ppo.packed_policy_and_values))
    return calls


STEP_FORMATS = {
    "trajectory": {},
    # `full` history: an episode's step rows share its earlier turns; steps_per_batch=4 leaves steps out, which the
    # critic values in a pass of their own
    "stepwise": {"episode_format": "stepwise", "history": "full", "max_turns": 4, "num_generations": 1,
                 "steps_per_batch": 4},
}


@pytest.mark.parametrize("episode_format", list(STEP_FORMATS))
def test_a_ppo_step_and_its_loss_are_the_same_packed_or_padded(episode_format, tiny_chatml_model, tmp_path,
                                                                monkeypatch):
    """The same rollout (same seed) scored with packing="prefix" and "padded": the old and reference log-probs, the
    critic's values and every target built from them, then the loss and its gradients over policy and critic."""
    trainer = make_trainer(tiny_chatml_model, tmp_path, "padded", **STEP_FORMATS[episode_format])
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    calls = count_packed_calls(monkeypatch)
    rows = [{"target": 2}, {"target": 2}, {"target": 3}, {"target": 3}]
    scored = {}
    for packing in ("padded", "prefix"):
        trainer.args.packing = packing
        torch.manual_seed(0)
        scored[packing] = trainer._generate_and_score_completions(rows)
        if packing == "padded":
            assert calls == {"values": 0, "loss": 0}
    padded, packed = scored["padded"], scored["prefix"]
    assert torch.equal(padded["completion_ids"], packed["completion_ids"])  # the same rollout
    if episode_format == "stepwise":
        batch = trainer.last_rollout
        kept = sum(s is not None for s in batch.steps)
        assert len(batch.step_samples()) > kept, "steps_per_batch left no step out: the test would be weak"
        assert calls["values"] == 2  # the rows' pass and the left-out steps' pass
    else:
        assert calls["values"] == 1
    ids = torch.cat([packed["prompt_ids"], packed["completion_ids"]], 1)
    mask = torch.cat([packed["prompt_mask"], packed["completion_mask"]], 1)
    assert plan_packs(ids, mask, packed["completion_ids"].shape[1]).forwarded_tokens < ids.numel()
    assert packed["old_values"].abs().sum() > 0
    for key in ("old_per_token_logps", "ref_per_token_logps", "old_values", "returns", "advantages"):
        torch.testing.assert_close(packed[key], padded[key], atol=ATOL, rtol=0, msg=key)
    assert torch.equal(packed["value_mask"], padded["value_mask"])

    assert_same_loss_packed_or_padded(trainer, packed)
    assert calls["loss"] == 1
    # both models were trained by the loss
    assert all(p.grad is not None for p in trainer.model.parameters())


@pytest.mark.parametrize("episode_format", list(STEP_FORMATS))
def test_ppo_trains_the_same_packed_or_padded(episode_format, tiny_chatml_model, tmp_path, monkeypatch):
    """Two optimizer steps of `train()` from one seed: the same losses, value losses and weights either way."""
    calls = count_packed_calls(monkeypatch)
    logs, weights = {}, {}
    for packing in ("padded", "prefix"):
        trainer = make_trainer(tiny_chatml_model, tmp_path / packing, packing, max_steps=2,
                               **STEP_FORMATS[episode_format])
        trainer.train()
        logs[packing] = [log[name] for log in trainer.state.log_history if "critic/value_loss" in log
                         for name in ("loss", "policy_loss", "critic/value_loss")]
        weights[packing] = [p.detach().clone() for p in trainer.model.parameters()]
    assert calls["loss"] >= 2 and calls["values"] >= 2  # "prefix" trained through the packed forwards
    assert len(logs["prefix"]) == len(logs["padded"]) == 2 * 3
    assert logs["prefix"] == pytest.approx(logs["padded"], rel=1e-5, abs=1e-6)
    for a, b in zip(weights["prefix"], weights["padded"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
