"""Prefix-tree packing (trl_multiturn/trainers/packing.py) against the step's padded log-prob function
(`logprobs.sequence_logps`, which every forward of a step, TRL's loss's included, uses): per-token log-probs, entropies
and gradients equal in fp32, on every row shape a step has; models that cannot take the mask refused or padded."""

import random
import types

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM
from trl.trainer.utils import pad

from trl_multiturn.trainers.logprobs import sequence_logps
from trl_multiturn.trainers.packing import (
    RowsPlanner,
    attention_cost_ratio,
    check_packing,
    model_inputs,
    packed_logps_and_entropies,
    packed_values,
    packing_refusal,
    plan_packs,
)
from trl_multiturn.trainers.value_model import PolicyAndValueModel, token_values

ATOL = 1e-5
TEMPERATURE = T = 0.7


def load(path, attn="sdpa", peft=False):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.float32)
    if peft:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    return model


@pytest.fixture(scope="module")
def model(tiny_chatml_model):
    return load(tiny_chatml_model)


def trl_padded(model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False):
    """The padded rows' log-probs and entropies, as the step computes them for TRL's loss."""
    return sequence_logps(model, input_ids, attention_mask, logits_to_keep, temperature=TEMPERATURE,
                          batch_size=batch_size, compute_entropy=compute_entropy)


def batch(rows):
    """(input_ids, attention_mask, logits_to_keep) of (prompt, completion) token lists as the trainers pad them:
    prompts on the left, completions on the right."""
    prompts = [torch.tensor(p, dtype=torch.long) for p, _ in rows]
    completions = [torch.tensor(c, dtype=torch.long) for _, c in rows]
    ids = torch.cat([pad(prompts, padding_value=0, padding_side="left"),
                     pad(completions, padding_value=0, padding_side="right")], 1)
    mask = torch.cat([pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
                      pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right")], 1)
    return ids, mask, max(len(c) for _, c in rows)


def tokens(rng, n):
    return [rng.randrange(3, 500) for _ in range(n)]


def grouped(rng, prompt_len=40, group=4, reply=(0, 12)):
    """A GRPO group: one prompt, `group` replies (two equal, two sharing their first tokens)."""
    prompt = tokens(rng, prompt_len)
    replies = [tokens(rng, rng.randint(*reply)) for _ in range(group)]
    replies[1] = list(replies[0])
    replies[2] = replies[0][:3] + tokens(rng, 5)
    return [(prompt, r) for r in replies]


def stepwise(rng, history, turns=5, prompt_len=30):
    """One step-wise episode's rows: per turn the context (the prompt and the history the policy keeps: every turn,
    or the last k) and the reply."""
    prompt = tokens(rng, prompt_len)
    played, rows = [], []
    for _ in range(turns):
        kept = played if history == "full" else played[len(played) - history:] if history else []
        reply = tokens(rng, rng.randint(2, 8))
        rows.append((prompt + [t for turn in kept for t in turn], reply))
        played.append(reply + tokens(rng, rng.randint(3, 9)))  # the reply and the observation after it
    return rows


def assert_exact(model, rows, batch_size=None, check_grads=True):
    """Packed log-probs, entropies and the gradients of a loss of both equal TRL's padded ones; returns the plan."""
    ids, mask, keep = batch(rows)
    plan = plan_packs(ids, mask, keep, batch_size, rho=attention_cost_ratio(model))
    results = []
    for packed in (False, True):
        model.zero_grad()
        if packed:
            logps, entropies = packed_logps_and_entropies(model, ids, mask, keep, batch_size, compute_entropy=True,
                                                          temperature=TEMPERATURE,
                                                          packing="prefix", planner=lambda *args, **kwargs: plan)
        else:
            logps, entropies = trl_padded(model, ids, mask, keep, batch_size, compute_entropy=True)[:2]
        weights = torch.linspace(-1, 1, logps.numel()).view_as(logps)
        ((logps * weights).sum() + 0.1 * entropies.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        results.append((logps.detach(), entropies.detach(), grads))
    (lp_pad, ent_pad, g_pad), (lp_pack, ent_pack, g_pack) = results
    assert lp_pad.shape == lp_pack.shape == (len(rows), keep)
    torch.testing.assert_close(lp_pack, lp_pad, atol=ATOL, rtol=0)
    torch.testing.assert_close(ent_pack, ent_pad, atol=ATOL, rtol=0)
    if check_grads:
        for a, b in zip(g_pack, g_pad, strict=True):
            # sums over every row's tokens, accumulated in another order: ATOL relative to the gradient's scale
            torch.testing.assert_close(a, b, atol=ATOL * max(1.0, b.abs().max().item()), rtol=1e-4)
    assert plan.distinct_tokens <= plan.forwarded_tokens <= plan.padded_tokens
    return plan


def test_a_grpo_group_forwards_its_prompt_once(model):
    rows = grouped(random.Random(0))
    plan = assert_exact(model, rows)
    assert len(plan.forwards) == 1 and plan.forwards[0].input_ids.shape[0] == 1  # one pack
    # the prompt once, each distinct reply's tokens once, and one re-forwarded token per reply that branches off a
    # position already predicting another reply's token
    assert plan.distinct_tokens < plan.forwarded_tokens < plan.distinct_tokens + len(rows)
    assert plan.forwarded_tokens < sum(len(p) + len(c) for p, c in rows) - 2 * len(rows[0][0])


def test_full_history_rows_are_one_chain(model):
    """Each row of a `full` history episode extends the row before it: the pack is the longest row, no more."""
    rows = stepwise(random.Random(1), "full")
    plan = assert_exact(model, rows)
    assert plan.forwarded_tokens == plan.distinct_tokens == max(len(p) + len(c) for p, c in rows)


def test_window_history_rows(model):
    rows = stepwise(random.Random(2), 2, turns=6)
    plan = assert_exact(model, rows)
    assert plan.forwarded_tokens < sum(len(p) + len(c) for p, c in rows)


def test_rows_without_a_shared_prefix_go_to_packs_of_their_own(model):
    rng = random.Random(3)
    rows = [([3 + i] + tokens(rng, 20), tokens(rng, 6)) for i in range(3)]
    plan = assert_exact(model, rows)
    assert plan.forwarded_tokens == plan.distinct_tokens == sum(len(p) + len(c) for p, c in rows)
    assert sum(f.input_ids.shape[0] for f in plan.forwards) == 3


def test_failed_and_truncated_rows(model):
    """A failed episode's row has no completion (all of its outputs 0), a truncated one stops mid-reply; a row that
    is a prefix of another (a truncated reply) needs no token of its own."""
    rng = random.Random(4)
    prompt = tokens(rng, 25)
    reply = tokens(rng, 10)
    rows = [(prompt, reply), (prompt, []), (prompt, reply[:4]), (tokens(rng, 7), [])]
    plan = assert_exact(model, rows)
    ids, mask, keep = batch(rows)
    logps, _ = packed_logps_and_entropies(model, ids, mask, keep, temperature=T, packing="prefix")
    assert (logps[1] == 0).all() and (logps[3] == 0).all() and (logps[2, 4:] == 0).all() and (logps[0] != 0).all()
    # the truncated reply and the failed row lie inside the full row: its tokens and the unrelated row's, no more
    assert plan.forwarded_tokens == plan.distinct_tokens == len(prompt) + len(reply) + 7


def test_a_label_conflict_inside_a_shared_prefix_reforwards_from_there(model):
    """Episode 1 replied [1, 9] to the prompt; episode 2's later row holds its reply [2, 3, 4] as context, and its
    first row scores that reply: the prompt's last position already predicts 1, so that row re-forwards from the
    prompt's last token on, although it shares three more tokens with the row before it."""
    prompt = tokens(random.Random(13), 20)
    rows = [(prompt, [1, 9]), (prompt + [2, 3, 4], [5]), (prompt, [2, 3, 4, 6])]
    plan = assert_exact(model, rows)
    assert plan.distinct_tokens == len(prompt) + 7
    assert plan.forwarded_tokens == plan.distinct_tokens + 4


def test_micro_batches_keep_the_padded_token_budget(model):
    """With TRL's chunk size below the batch, each forward holds at most batch_size x W tokens, and the rows split
    across packs stay exact."""
    rng = random.Random(5)
    rows = grouped(rng, group=4) + grouped(rng, group=4) + stepwise(rng, "full", turns=4)
    ids, _, _ = batch(rows)
    plan = assert_exact(model, rows, batch_size=2)
    budget = 2 * ids.shape[1]
    assert len(plan.forwards) > 1
    assert all(f.input_ids.numel() <= budget for f in plan.forwards)


def test_peft_model(tiny_chatml_model):
    model = load(tiny_chatml_model, peft=True)
    assert_exact(model, grouped(random.Random(6)) + stepwise(random.Random(7), "full", turns=3))


def test_a_critics_values(tiny_chatml_model):
    """PPO's critic reads the same packed rows (through the policy-and-critic module, as the trainer runs it): its
    values at the position before each kept token equal `token_values` of the padded rows wherever the loss reads
    them, and so do their gradients."""
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    critic = AutoModelForTokenClassification.from_pretrained(tiny_chatml_model, num_labels=1,
                                                             attn_implementation="sdpa", dtype=torch.float32)
    rows = grouped(random.Random(14)) + stepwise(random.Random(15), "full", turns=3)
    ids, mask, keep = batch(rows)
    plan = plan_packs(ids, mask, keep)
    assert plan.forwarded_tokens < plan.padded_tokens
    results = []
    for packed in (False, True):
        critic.zero_grad()
        values = packed_values(PolicyAndValueModel(load(tiny_chatml_model), critic), plan) if packed else \
            token_values(critic, ids, mask, keep)
        values = values.masked_fill(~plan.valid, 0)
        (values * torch.linspace(-1, 1, values.numel()).view_as(values)).sum().backward()
        results.append((values.detach(), [p.grad.clone() for p in critic.parameters()]))
    (v_pad, g_pad), (v_pack, g_pack) = results
    assert plan.valid.sum() == sum(len(c) for _, c in rows)
    torch.testing.assert_close(v_pack, v_pad, atol=ATOL, rtol=0)
    for a, b in zip(g_pack, g_pad, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL * max(1.0, b.abs().max().item()), rtol=1e-4)


def test_eager_attention_takes_the_additive_mask(tiny_chatml_model):
    model = load(tiny_chatml_model, attn="eager")
    ids, mask, keep = batch(grouped(random.Random(8)))
    plan = plan_packs(ids, mask, keep)
    assert model_inputs(model, plan.forwards[0])["attention_mask"].dtype == torch.float32
    assert_exact(model, grouped(random.Random(8)))


@settings(max_examples=30)
@given(st.data())
def test_random_prefix_forests(model, data):
    """Rows drawn as random walks down a random prefix forest (shared prompts of any length, completions starting
    anywhere, equal rows, rows that are prefixes of others) stay exact."""
    seed = data.draw(st.integers(0, 10_000))
    rng = random.Random(seed)
    stems = [tokens(rng, rng.randint(1, 12)) for _ in range(rng.randint(1, 3))]
    rows = []
    for _ in range(rng.randint(1, 6)):
        full = rng.choice(stems) + tokens(rng, rng.randint(0, 3)) + [rng.choice([5, 6])] * rng.randint(0, 3)
        full += tokens(rng, rng.randint(1, 6))
        cut = rng.randint(1, len(full))
        rows.append((full[:cut], full[cut:]))
    assume(any(completion for _, completion in rows))  # TRL keeps at least one column
    assert_exact(model, rows, batch_size=rng.choice([None, 1, 2]), check_grads=False)



def test_unmaskable_attention_is_refused_by_name_or_padded(model):
    """flash attention rebuilds no custom mask: "prefix" refuses it naming the implementation, "auto" takes the
    padded path (TRL's), and "padded" never packs."""
    rows = grouped(random.Random(9))
    ids, mask, keep = batch(rows)
    expected = trl_padded(model, ids, mask, keep)
    calls = []

    def padded(*args, **kwargs):  # records the call; the kernel itself is not on this machine
        calls.append(args)
        return expected

    config = model.config
    model.config = types.SimpleNamespace(_attn_implementation="flash_attention_2", pad_token_id=0)
    try:
        assert "flash_attention_2" in packing_refusal(model, 10)
        with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'"):
            packed_logps_and_entropies(model, ids, mask, keep, temperature=T, packing="prefix", padded=padded)
        assert not calls
        logps, _ = packed_logps_and_entropies(model, ids, mask, keep, temperature=T, packing="auto", padded=padded)
        assert len(calls) == 1 and logps is expected[0]
    finally:
        model.config = config
    packed_logps_and_entropies(model, ids, mask, keep, temperature=T, packing="padded", padded=padded)
    assert len(calls) == 2
    logps, _ = packed_logps_and_entropies(model, ids, mask, keep, temperature=T, packing="auto", padded=padded)
    assert len(calls) == 2  # a shared prompt: auto packs
    torch.testing.assert_close(logps, expected[0], atol=ATOL, rtol=0)


def test_sliding_window_shorter_than_the_rows_falls_back():
    """The packed mask carries no window: a sliding-window model is refused where its rows outgrow the window, and
    "auto" is then exact by the padded path (where packing would not be)."""
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                           attn_implementation="sdpa", initializer_range=0.2)
    model = MistralForCausalLM(config)
    assert packing_refusal(model, 8) is None
    assert "sliding_window=8" in packing_refusal(model, 9)
    ids, mask, keep = batch(grouped(random.Random(10), prompt_len=20))
    with pytest.raises(ValueError, match="sliding_window=8"):
        packed_logps_and_entropies(model, ids, mask, keep, temperature=T, packing="prefix")
    logps, _ = packed_logps_and_entropies(model, ids, mask, keep, temperature=T, packing="auto", padded=trl_padded)
    torch.testing.assert_close(logps, trl_padded(model, ids, mask, keep)[0])


def test_one_plan_serves_every_forward_of_the_same_rows(model, monkeypatch):
    """The trainers plan through a RowsPlanner: the old, reference and critic passes over one batch's rows plan
    once; other rows, rows written since, or another budget get a plan of their own."""
    from trl_multiturn.trainers import packing

    calls = []
    real = packing.plan_packs
    monkeypatch.setattr(packing, "plan_packs", lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    ids, mask, keep = batch(grouped(random.Random(0)))
    planner = RowsPlanner()
    first = planner(ids, mask, keep, 2)
    assert planner(ids, mask, keep, 2) is first and len(calls) == 1
    logps, _ = packed_logps_and_entropies(model, ids, mask, keep, 2, temperature=T, packing="prefix", planner=planner)
    assert len(calls) == 2  # the model's pad id and cost ratio are part of the plan: planned once for them
    again, _ = packed_logps_and_entropies(model, ids, mask, keep, 2, temperature=T, packing="prefix", planner=planner)
    assert len(calls) == 2 and torch.equal(logps, again)
    planner(ids, mask, keep, 3)  # another budget
    planner(ids.clone(), mask, keep, 3)  # other rows
    assert len(calls) == 4
    ids[0, -1] = ids[0, -1]  # written in place: the same tensor, perhaps other tokens
    planner(ids, mask, keep, 3)
    assert len(calls) == 5


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="packing='tree'.*'auto', 'prefix', 'padded'"):
        check_packing("tree")
    ids, mask, keep = batch([([5, 6, 7], [8, 9])])
    holes = mask.clone()
    holes[0, 1] = 0
    with pytest.raises(ValueError, match="row 0: attention_mask has holes"):
        plan_packs(ids, holes, keep)
    with pytest.raises(ValueError, match="row 0: a kept column holds the row's first token"):
        plan_packs(ids, mask, 5)


def test_auto_pads_rows_that_share_nothing(model):
    """With no shared prefix the packs are the rows themselves: the cost model finds no saving and "auto" pads."""
    rng = random.Random(12)
    rows = [([3 + i] + tokens(rng, 30), tokens(rng, 6)) for i in range(4)]
    ids, mask, keep = batch(rows)
    plan = plan_packs(ids, mask, keep, rho=attention_cost_ratio(model))
    assert plan.packed_cost >= plan.padded_cost
    calls = []
    packed_logps_and_entropies(model, ids, mask, keep, temperature=T, packing="auto",
                               padded=lambda *a, **k: calls.append(1) or trl_padded(*a, **k))
    assert calls == [1]


@pytest.mark.parametrize("trainer_name", ["grpo", "rloo"])
def test_a_trainers_step_and_loss_are_the_same_packed_or_padded(trainer_name, tiny_chatml_model, tmp_path):
    """The trainers route every forward through packing: a batch's old log-probs, its loss and the loss's gradients
    are those of the padded rows (a group's rows share their prompt, so "prefix" does pack)."""
    from conftest import tiny_rl_args
    from datasets import Dataset
    from toy_envs import CountingEnv

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnRLOOConfig, MultiTurnRLOOTrainer

    config_cls, trainer_cls = {"grpo": (MultiTurnGRPOConfig, MultiTurnGRPOTrainer),
                               "rloo": (MultiTurnRLOOConfig, MultiTurnRLOOTrainer)}[trainer_name]
    args = tiny_rl_args(config_cls, tmp_path, packing="prefix", reward_mode="dense", num_iterations=2,
                        action_parser="trl_multiturn.rollout.parsing:whole_reply")
    trainer = trainer_cls(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                          train_dataset=Dataset.from_list([{"target": 2}] * 4))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions([{"target": 2}, {"target": 2}, {"target": 3}, {"target": 3}])
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    plan = plan_packs(ids, mask, inputs["completion_ids"].shape[1])
    assert plan.forwarded_tokens < plan.padded_tokens  # the rows do share prefixes
    padded_old = sequence_logps(trainer.model, ids, mask, inputs["completion_ids"].shape[1],
                                temperature=trainer.temperature)[0]
    torch.testing.assert_close(inputs["old_per_token_logps"], padded_old, atol=ATOL, rtol=0)
    assert_same_loss_packed_or_padded(trainer, inputs)


def assert_same_loss_packed_or_padded(trainer, inputs) -> None:
    """`trainer._compute_loss` on `inputs` and the gradients of every parameter it reaches are the same with
    packing="prefix" as with "padded"."""
    losses = {}
    for packing in ("prefix", "padded"):
        trainer.args.packing = packing
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        losses[packing] = (loss.item(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None])
    assert losses["prefix"][0] == pytest.approx(losses["padded"][0], abs=1e-5)
    assert len(losses["prefix"][1]) == len(losses["padded"][1]) > 0
    for a, b in zip(losses["prefix"][1], losses["padded"][1], strict=True):
        torch.testing.assert_close(a, b, atol=ATOL * max(1.0, b.abs().max().item()), rtol=1e-4)


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_a_step_plans_its_rows_once(trainer_name, tiny_chatml_model, tmp_path, monkeypatch):
    """The old log-probs, the reference's (GRPO with beta) and the critic's values (PPO) forward one batch's rows:
    one prefix-tree plan serves them."""
    from conftest import tiny_rl_args
    from datasets import Dataset
    from toy_envs import CountingEnv

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnPPOConfig, MultiTurnPPOTrainer
    from trl_multiturn.trainers import packing

    config_cls, trainer_cls, extra = {"grpo": (MultiTurnGRPOConfig, MultiTurnGRPOTrainer, {"beta": 0.1}),
                                      "ppo": (MultiTurnPPOConfig, MultiTurnPPOTrainer, {})}[trainer_name]
    args = tiny_rl_args(config_cls, tmp_path, packing="prefix", reward_mode="dense", num_iterations=2,
                        action_parser="trl_multiturn.rollout.parsing:whole_reply", **extra)
    trainer = trainer_cls(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                          train_dataset=Dataset.from_list([{"target": 2}] * 4))
    forwards, plans = [], []
    real_plan, real_run = packing.plan_packs, packing._run_packed
    monkeypatch.setattr(packing, "plan_packs", lambda *args, **kwargs: plans.append(1) or real_plan(*args, **kwargs))
    monkeypatch.setattr(packing, "_run_packed", lambda *args, **kw: forwards.append(1) or real_run(*args, **kw))
    try:
        trainer._generate_and_score_completions([{"target": 2}, {"target": 2}, {"target": 3}, {"target": 3}])
    finally:
        trainer.close()
    assert len(forwards) >= 2 and len(plans) == 1  # old and reference log-probs (PPO: and values), one plan
