"""On-policy distillation (`trainers/distillation.py`): the teacher's log-probs packed as the reference's, its
per-token reward through GRPO's credit or alone as the advantages, observation tokens never rewarded, and a teacher
that does not share the student's vocabulary refused at the start."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import CountingEnv, openai_loop_agent
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl.trainer.utils import pad

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnPPOConfig, MultiTurnRLOOConfig
from trl_multiturn.agents import AgentEnvironment
from trl_multiturn.trainers.distillation import check_teacher_vocabulary
from trl_multiturn.trainers.forwards import Forwards
from trl_multiturn.trainers.step_tensors import StepTensors

ROWS = [{"target": 2}, {"target": 2}, {"target": 3}, {"target": 3}]


@pytest.fixture(scope="module")
def perturbed_teacher(tiny_chatml_model, tmp_path_factory):
    """The student's weights with noise added, saved with the student's tokenizer: a teacher that disagrees."""
    model = AutoModelForCausalLM.from_pretrained(tiny_chatml_model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    out = tmp_path_factory.mktemp("teacher")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_chatml_model).save_pretrained(out)
    return str(out)


def make_trainer(model, output_dir, teacher_model=None, **overrides):
    args = tiny_rl_args(MultiTurnGRPOConfig, output_dir, max_steps=1, reward_mode="dense", packing="prefix",
                        action_parser="trl_multiturn.rollout.parsing:whole_reply", **overrides)
    return MultiTurnGRPOTrainer(model=model, args=args, environment_factory=CountingEnv,
                                train_dataset=Dataset.from_list(ROWS), teacher_model=teacher_model)


@pytest.fixture(scope="module")
def trainer(tiny_chatml_model, perturbed_teacher, tmp_path_factory):
    trainer = make_trainer(tiny_chatml_model, tmp_path_factory.mktemp("distill"),
                           teacher_model_name_or_path=perturbed_teacher)
    yield trainer
    trainer.close()


def teacher_outputs(trainer, monkeypatch) -> list:
    """The list into which each of the trainer's teacher forwards puts its log-probs from now on."""
    seen, teacher_logps = [], trainer.forwards.teacher
    monkeypatch.setattr(trainer.forwards, "teacher", lambda x, mode: seen.append(teacher_logps(x, mode)) or seen[-1])
    return seen


def scored_batch(trainer, seed=0):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(list(ROWS))


def test_the_teachers_log_probs_packed_equal_each_row_forwarded_alone(trainer, perturbed_teacher):
    teacher = AutoModelForCausalLM.from_pretrained(perturbed_teacher).eval()
    # A group sharing a prompt, one row with a longer prompt (left padding), replies of three lengths (right padding)
    prompts, replies = [[3, 4, 5], [3, 4, 5], [7, 3, 4, 5]], [[6, 7, 8, 9], [6, 7, 10], [11, 12]]

    def padded(lists, side):
        return pad([torch.tensor(v) for v in lists], padding_value=0, padding_side=side)

    x = StepTensors(prompt_ids=padded(prompts, "left"), prompt_mask=padded([[1] * len(p) for p in prompts], "left"),
                    completion_ids=padded(replies, "right"),
                    completion_mask=padded([[1] * len(r) for r in replies], "right"),
                    trained=padded([[1] * len(r) for r in replies], "right"), sampled_logps=None)
    args = SimpleNamespace(packing="prefix", per_device_train_batch_size=3, per_device_eval_batch_size=3,
                           gradient_checkpointing_kwargs=None)
    # packing='prefix' packs or raises: these log-probs come from the prefix tree
    forwards = Forwards(lambda: None, lambda: None, trainer.accelerator, args, temperature=0.7, pad_token_id=0,
                        teacher=teacher)
    packed = forwards.teacher(x, "train")
    for i, (prompt, reply) in enumerate(zip(prompts, replies)):
        with torch.no_grad():
            logits = teacher(input_ids=torch.tensor([prompt + reply])).logits[0, len(prompt) - 1:-1]
        alone = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)
        assert torch.allclose(packed[i, :len(reply)], alone, atol=1e-5), i
        assert torch.all(packed[i, len(reply):] == 0)


def test_a_grpo_step_with_a_teacher_trains_and_logs_its_reverse_kl(trainer):
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(result.training_loss)
    log = next(log for log in trainer.state.log_history if "teacher/reverse_kl" in log)
    assert log["teacher/reverse_kl"] > 0  # a perturbed teacher disagrees with the student
    assert 0 < log["teacher/reward_share"] < 1  # the environment rewards too (dense: turn k earns k)
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters()))


def test_the_teacher_alone_rewards_each_sampled_token_and_no_observation_token(trainer, monkeypatch):
    seen = teacher_outputs(trainer, monkeypatch)
    monkeypatch.setattr(trainer.step.distillation, "signal", "loss")
    inputs = scored_batch(trainer)
    sampled = inputs["tool_mask"].bool()
    observations = inputs["completion_mask"].bool() & ~sampled
    assert observations.any() and sampled.any()  # episodes of two and three turns: observations between replies
    (teacher,) = seen
    assert torch.all(teacher[observations] != 0)  # the teacher scores the observation tokens...
    advantages = inputs["advantages"]
    assert torch.all(advantages[observations] == 0)  # ...which get no reward from it
    expected = -trainer.args.teacher_kl_coef * (inputs["old_per_token_logps"] - teacher)
    assert torch.allclose(advantages[sampled], expected[sampled], atol=1e-6)
    assert (advantages[sampled] != 0).float().mean() > 0.9


def test_a_teacher_equal_to_the_student_changes_nothing_and_one_that_differs_moves_the_advantages(trainer,
                                                                                                   monkeypatch):
    distillation = trainer.step.distillation
    taught = scored_batch(trainer)
    monkeypatch.setattr(trainer.step, "distillation", None)
    untaught = scored_batch(trainer)
    assert torch.equal(taught["completion_ids"], untaught["completion_ids"])  # the same episodes
    observations = taught["completion_mask"].bool() & ~taught["tool_mask"].bool()
    assert torch.all(taught["advantages"][observations] == 0)
    assert not torch.allclose(taught["advantages"], untaught["advantages"])  # the teacher's reward is in the credit
    # The student's own copy as the teacher: reverse KL 0, the advantages the environment's alone.
    monkeypatch.setattr(trainer.step, "distillation", distillation)
    monkeypatch.setattr(trainer.forwards, "teacher_model",
                        copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).eval())
    metrics = trainer._metrics["train"]
    metrics.clear()
    as_own_teacher = scored_batch(trainer)
    assert torch.equal(as_own_teacher["completion_ids"], untaught["completion_ids"])
    assert metrics["teacher/reverse_kl"] == [0.0] and metrics["teacher/reward_share"] == [0.0]
    assert torch.equal(as_own_teacher["advantages"], untaught["advantages"])


def test_an_agents_episodes_are_scored_by_the_teacher_on_the_ids_it_was_sampled(tiny_chatml_model, perturbed_teacher,
                                                                                  tmp_path, monkeypatch):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_steps=1, max_turns=4, teacher_signal="loss",
                        teacher_model_name_or_path=perturbed_teacher)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args,
                                   environment_factory=AgentEnvironment(openai_loop_agent),
                                   train_dataset=Dataset.from_list([{"goal": "Find the key."}] * 2))
    seen = teacher_outputs(trainer, monkeypatch)
    trainer.model.train()
    torch.manual_seed(0)
    try:
        inputs = trainer._generate_and_score_completions([{"goal": "Find the key."}] * 2)
    finally:
        trainer.close()
    assert all(ep.num_turns == 2 and not ep.failed for ep in trainer.last_rollout.episodes)
    sampled = inputs["tool_mask"].bool()
    observations = inputs["completion_mask"].bool() & ~sampled  # the agent's second user message
    assert observations.any()
    expected = -(inputs["old_per_token_logps"] - seen[0])
    assert torch.allclose(inputs["advantages"][sampled], expected[sampled], atol=1e-6)
    assert torch.all(inputs["advantages"][observations] == 0) and torch.all(seen[0][observations] != 0)


def test_a_teacher_with_another_vocabulary_is_refused_at_the_start(tiny_chatml_model, tiny_llama3_model, tmp_path):
    # a model object, whose tokenizer is the one saved where it was loaded from
    other = AutoModelForCausalLM.from_pretrained(tiny_llama3_model)
    with pytest.raises(ValueError, match=r"teacher_model=.*its tokenizer differs from the student's on \d+ tokens"):
        make_trainer(tiny_chatml_model, tmp_path, teacher_model=other)
    # A model object without a tokenizer of its own: its logits must cover the student's every token id.
    student_tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    small = LlamaForCausalLM(LlamaConfig(vocab_size=len(student_tokenizer) - 1, hidden_size=8, intermediate_size=16,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match=f"its logits cover {len(student_tokenizer) - 1} token ids"):
        check_teacher_vocabulary(student_tokenizer, small, small)


@pytest.mark.parametrize("config_cls, values, message", [
    (MultiTurnGRPOConfig, {"teacher_kl_coef": -0.5}, "teacher_kl_coef"),
    (MultiTurnGRPOConfig, {"teacher_kl_coef": 0.0}, "teacher_kl_coef"),
    (MultiTurnGRPOConfig, {"teacher_signal": "logits"}, "teacher_signal"),
    (MultiTurnPPOConfig, {"teacher_signal": "loss"}, "teacher_signal='loss' is not supported by MultiTurnPPOConfig"),
    (MultiTurnRLOOConfig, {"teacher_signal": "loss"}, "set loss_granularity='turn'"),
])
def test_bad_distillation_settings_are_refused_when_the_config_is_built(config_cls, values, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        tiny_rl_args(config_cls, tmp_path, **values)


def test_a_trainer_without_a_usable_teacher_refuses_to_start(tiny_chatml_model, tmp_path):
    with pytest.raises(ValueError, match="teacher_signal='loss' trains on a teacher's signal alone, and no teacher"):
        make_trainer(tiny_chatml_model, tmp_path, teacher_signal="loss")
    student = AutoModelForCausalLM.from_pretrained(tiny_chatml_model)
    with pytest.raises(ValueError, match="teacher_model is the model being trained"):
        make_trainer(student, tmp_path, teacher_model=student)
    assert all(p.requires_grad for p in student.parameters())
