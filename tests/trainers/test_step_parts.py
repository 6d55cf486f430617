"""The step's parts, each without a trainer: the credits and the scorer on a hand-made batch, the forwards on a tiny
model, the episode source with a scripted generator, and the step itself assembled from stand-ins of its parts."""

import copy
import dataclasses
import functools
import math
from collections import defaultdict
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from toy_envs import ReplyScoringEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn.credit.gae import ValueBatch, gae
from trl_multiturn.rollout import EpisodeRunner
from trl_multiturn.rollout.episode import Episode, Status, Turn
from trl_multiturn.rollout.rules import EpisodeRules
from trl_multiturn.trainers.batch import RolloutBatch
from trl_multiturn.trainers.episode_source import EpisodeSource
from trl_multiturn.trainers.estimator_credit import EstimatorCredit
from trl_multiturn.trainers.forwards import Forwards
from trl_multiturn.trainers.generation_backend import GenerationBackend, Sampling
from trl_multiturn.trainers.ppo_credit import CriticCredit
from trl_multiturn.trainers.rows import StepRows, StepSample
from trl_multiturn.trainers.scorer import Scorer
from trl_multiturn.trainers.step import MultiTurnStep
from trl_multiturn.trainers.step_log import StepLog
from trl_multiturn.trainers.step_tensors import StepTensors
from trl_multiturn.trainers.trl_compat import capped_replies


class OneProcess:
    """A stand-in for accelerate's `Accelerator` on one CPU process (what the parts call of it)."""

    device = torch.device("cpu")
    num_processes, process_index = 1, 0

    def gather(self, tensor):
        return tensor

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def unwrap_model(self, model):
        return model

    def autocast(self):
        return nullcontext()


def step_log(names=("environment_return",)):
    """A `StepLog` into fresh logs shaped as TRL's `_metrics` and `_logs`."""
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    logs = {"prompt": [], "completion": [], "advantages": [], "rewards": defaultdict(list),
            "extra": defaultdict(list)}
    return StepLog(metrics, logs, OneProcess(), lambda: SimpleNamespace(global_step=0, num_input_tokens_seen=0),
                   list(names))


def episode(rewards, spans, length) -> Episode:
    """A lost episode of `len(rewards)` turns whose replies cover `spans` of a `length`-token completion."""
    ep = Episode(task={}, prompt_ids=[5], prompt_messages=[{"role": "user", "content": "go"}],
                 completion_ids=list(range(10, 10 + length)), env_mask=[0] * length, logprobs=[0.0] * length,
                 status=Status.LOST)
    for start, end in spans:
        ep.env_mask[start:end] = [1] * (end - start)
    ep.turns = [Turn("a", "a", span, reward=r) for span, r in zip(spans, rewards)]
    return ep


def tensors(mask) -> StepTensors:
    mask = torch.tensor(mask)
    ids = torch.arange(mask.numel()).view(mask.shape)
    ones = torch.ones_like(mask)
    return StepTensors(prompt_ids=ids[:, :1], prompt_mask=ones[:, :1], completion_ids=ids, completion_mask=ones,
                       trained=mask, sampled_logps=None)


def test_the_critic_credit_alone_folds_the_kl_and_the_reward_functions_into_gae():
    # One episode: turn 0 samples position 0, an observation fills 1-2, turn 1 samples 3-4.
    ep = episode([1.0, 2.0], [(0, 1), (3, 5)], 5)
    batch = RolloutBatch([ep], [[1.0, 2.0]], torch.tensor([1.0, 0.5]), num_generations=1,
                         rewards_per_func=torch.tensor([[3.0, 4.0]]))  # reward_funcs' 4.0, weighted 0.5
    x = tensors([[1, 0, 0, 1, 1]])
    values = torch.tensor([[0.5, 9.0, 9.0, 0.25, 0.75]])

    class CriticOnly:  # stand-in for `Forwards`: fixed critic values, padded rows
        def batch_size(self, mode):
            return 1

        def plan(self, *args):
            return None

        def values(self, input_ids, attention_mask, length, batch_size, plan):
            return values

    log = step_log(["environment_return", "length"])
    args = SimpleNamespace(kl_coef=0.5, gamma=0.9, lam=0.8, advantage_estimator="gae", whiten_advantages=False,
                           mask_truncated_completions=False)
    credit = CriticCredit(args, CriticOnly(), log, OneProcess(), beta=0.0)
    assert credit.needs_old_logps() and credit.needs_reference()
    old, ref = torch.full((1, 5), -1.0), torch.full((1, 5), -1.5)
    advantages, extra = credit(batch, x, old, ref)
    # Turn 0's reward on its last token, turn 1's plus the reward functions' 0.5 * 4.0 on its own; the KL 0.5 *
    # (old - ref) = 0.25 subtracted on each sampled token; the observation's values never used.
    mask = x.trained.bool()
    rewards = torch.tensor([[1.0 - 0.25, 0.0, 0.0, -0.25, 2.0 + 2.0 - 0.25]]) * mask
    expected = gae(ValueBatch(rewards, values * mask, mask), gamma=0.9, lam=0.8)
    assert torch.allclose(advantages, expected.advantages) and torch.allclose(extra["returns"], expected.returns)
    assert torch.equal(extra["old_values"], values * mask) and torch.equal(extra["value_mask"], mask)
    assert log.metrics["train"]["kl_in_reward"] == [pytest.approx(0.5)]
    assert log.metrics["train"]["critic/value_mean"] == [pytest.approx((0.5 + 0.25 + 0.75) / 3)]
    # A distillation teacher's per-token rewards join each sampled token's reward before GAE (none reaches the
    # observation, even where the tensor holds one)
    taught, _ = credit(batch, x, old, ref, torch.tensor([[0.1, 5.0, 5.0, -0.2, 0.3]]))
    expected = gae(ValueBatch(rewards + torch.tensor([[0.1, 0.0, 0.0, -0.2, 0.3]]), values * mask, mask), gamma=0.9,
                   lam=0.8)
    assert torch.allclose(taught, expected.advantages)


def test_the_estimator_credit_alone_broadcasts_each_episodes_advantage_to_its_sampled_tokens():
    # One task, two episodes: returns 3 and 7, so GRPO without scaling gives -2 and +2.
    episodes = [episode([1.0, 2.0], [(0, 1), (2, 3)], 3), episode([3.0, 4.0], [(0, 2), (2, 3)], 3)]
    batch = RolloutBatch(episodes, [[1.0, 2.0], [3.0, 4.0]], torch.ones(1), num_generations=2,
                         rewards_per_func=torch.tensor([[3.0], [7.0]]))
    log = step_log()
    credit = EstimatorCredit("grpo", None, {"gamma": 1.0, "scale": False}, reference=False, log=log)
    assert not credit.needs_old_logps() and not credit.needs_reference()
    advantages, extra = credit(batch, tensors([[1, 0, 1], [1, 1, 1]]), None, None)
    assert extra == {}
    assert advantages.tolist() == [[-2.0, 0.0, -2.0], [2.0, 2.0, 2.0]]  # the observation token takes none
    assert log.metrics["train"]["credit/zero_advantage_groups"] == [0.0]
    # A distillation teacher's per-token rewards join each turn's reward as their sum over the turn's tokens: the
    # returns become 3 + 1 + 3 = 7 and 7 + 0.5 + 0.5 = 8, so GRPO gives -0.5 and +0.5
    advantages, _ = credit(batch, tensors([[1, 0, 1], [1, 1, 1]]), None, None,
                           torch.tensor([[1.0, 0.0, 3.0], [0.5, 0.5, 0.0]]))
    assert advantages.tolist() == [[-0.5, 0.0, -0.5], [0.5, 0.5, 0.5]]


def test_the_forwards_alone_give_the_log_softmax_of_the_sampled_tokens_packed_or_padded(tiny_chatml_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_chatml_model).eval()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(0.5)
    # Two rows sharing a prompt, the second one token shorter (right padding).
    x = StepTensors(prompt_ids=torch.tensor([[3, 4, 5], [3, 4, 5]]), prompt_mask=torch.ones(2, 3, dtype=torch.long),
                    completion_ids=torch.tensor([[6, 7, 8], [6, 9, 0]]),
                    completion_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]), trained=torch.ones(2, 3),
                    sampled_logps=None)
    with torch.no_grad():
        logits = model(input_ids=x.input_ids, attention_mask=x.attention_mask).logits.float()
    by_hand = torch.log_softmax(logits[:, 2:-1] / 0.7, dim=-1).gather(-1, x.completion_ids.unsqueeze(-1)).squeeze(-1)
    by_hand = by_hand.masked_fill(x.completion_mask == 0, 0.0)
    for packing in ("prefix", "padded"):
        args = SimpleNamespace(packing=packing, per_device_train_batch_size=2, per_device_eval_batch_size=2,
                               gradient_checkpointing_kwargs=None)
        forwards = Forwards(lambda: model, lambda: reference, OneProcess(), args, temperature=0.7, pad_token_id=0)
        old = forwards.old(x, "train")
        assert torch.allclose(old, by_hand, atol=1e-5), packing
        assert not old.requires_grad
        # the reference model's own weights, as the policy's own forward of them gives
        as_policy = Forwards(lambda: reference, lambda: None, OneProcess(), args, temperature=0.7, pad_token_id=0)
        assert torch.allclose(forwards.reference(x, "train"), as_policy.old(x, "train"), atol=1e-6)
        assert not torch.allclose(forwards.reference(x, "train"), old, atol=1e-3)


def scripted_backend(sample_replies, generation_config, *, processes=OneProcess(), use_vllm=False, pad_token_id=0):
    """A generation backend over a scripted `sample_replies` in place of TRL's single-turn generation (the episode
    history cache off), its reply cap on `generation_config`, a stand-in of TRL's."""
    args = SimpleNamespace(cache_episode_history=False, rollout_overlap=False)
    return GenerationBackend(processes, args, policy=None, wrapped_model=None,
                             tokenizer=SimpleNamespace(pad_token_id=pad_token_id), stop_token_ids=[0],
                             sampling=Sampling(1.0, 1.0, 0), sample_replies=sample_replies,
                             reply_cap=functools.partial(capped_replies, SimpleNamespace(
                                 use_vllm=False, generation_config=generation_config)), use_vllm=use_vllm)


class TwoProcesses(OneProcess):
    """Rank 0 of two, whose other rank has `other_live` live episodes (what `reduce` adds to this rank's count)."""

    num_processes = 2

    def __init__(self, other_live=0):
        self.other_live = other_live

    def reduce(self, tensor, reduction="sum"):
        return tensor + self.other_live


def test_the_generation_backend_caps_trls_generation_per_call_and_keeps_the_ranks_calls_equal():
    config, calls = SimpleNamespace(max_new_tokens=8), []

    def sample_replies(contexts):  # a reply as long as the cap TRL reads, its log-probs beside it
        calls.append((contexts, config.max_new_tokens))
        return [(9,) * config.max_new_tokens for _ in contexts], [[-0.5] * config.max_new_tokens for _ in contexts]

    backend = scripted_backend(sample_replies, config)
    completions, logprobs = backend([[1, 2], [3]], 3)
    assert calls == [([[1, 2], [3]], 3)] and completions == [[9, 9, 9]] * 2 and logprobs == [[-0.5] * 3] * 2
    assert config.max_new_tokens == 8  # restored after the call
    assert backend([[1]], 100)[0] == [[9] * 8]  # never above TRL's own cap
    assert backend([[1]], 0)[0] == [[9]]  # at least one token
    calls.clear()
    assert backend([], 3) == ([], None) and calls == []  # alone, a rank with nothing live skips the call
    assert not backend.any_live(0) and backend.any_live(2)
    with backend.rollout():  # no episode-history cache: TRL unwraps the model per call, nothing to do around it
        pass
    # beside another rank, a rank with nothing live still calls: with a one-token dummy (transformers), none (vLLM)
    for use_vllm, sent in ((False, [[5]]), (True, [])):
        calls.clear()
        ranked = scripted_backend(sample_replies, config, processes=TwoProcesses(), use_vllm=use_vllm, pad_token_id=5)
        assert ranked([], 3)[0] == [] and calls == [(sent, 3)]
    assert not scripted_backend(sample_replies, config, processes=TwoProcesses(other_live=0)).any_live(0)
    assert scripted_backend(sample_replies, config, processes=TwoProcesses(other_live=1)).any_live(0)


def test_the_episode_source_alone_plays_shapes_and_lays_out_rows_with_a_scripted_generator(tiny_chatml_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml_model)
    replies = {"aab": tokenizer.encode("aab", add_special_tokens=False) + [tokenizer.eos_token_id]}
    config, caps = SimpleNamespace(max_new_tokens=5), []

    def scripted(contexts):  # the same reply to every context
        caps.append(config.max_new_tokens)
        return [list(replies["aab"]) for _ in contexts], None

    generation = scripted_backend(scripted, config, pad_token_id=tokenizer.pad_token_id)
    runner = EpisodeRunner(ReplyScoringEnv, tokenizer, generation,
                           EpisodeRules(max_turns=3, action_parser="trl_multiturn.rollout.parsing:whole_reply"),
                           eos_token_ids=[tokenizer.eos_token_id], env_mode="inline")
    args = SimpleNamespace(save_episodes=False, reward_mode="dense", success_reward=1.0, format_penalty=0.0,
                           steps_per_batch=None, steps_per_generation=1, seed=0, mask_truncated_completions=False,
                           max_policy_lag=0)
    source = EpisodeSource(runner, args, OneProcess(), generation=generation,
                           lagged=None, training=lambda: True,
                           state=lambda: SimpleNamespace(global_step=0), reward_weights=torch.tensor([2.0]),
                           num_generations=2, num_generations_eval=2, log=step_log())
    try:
        rows, batch = source([{"turns": 2, "id": 0}, {"turns": 1, "id": 1}])
    finally:
        runner.close()
    assert caps == [5, 5]  # one call per turn, under the cap TRL reads
    per_turn = 2 / 3  # "aab": two distinct characters of three
    assert [ep.num_turns for ep in batch.episodes] == [2, 1] and batch.mode == "train"
    assert batch.turn_rewards == [[2 * per_turn] * 2, [2 * per_turn]]  # times the environment's weight
    assert [row["episode_return"] for row in rows] == [pytest.approx(2 * per_turn), pytest.approx(per_turn)]
    assert [row["id"] for row in rows] == [0, 1] and rows[0]["prompt"] == batch.episodes[0].prompt_messages
    start, end = batch.episodes[0].turn_spans[1]
    assert batch.episodes[0].completion_ids[start:end] == replies["aab"]
    env_mask = [ep.env_mask for ep in batch.episodes]
    assert source.trained_mask(batch, env_mask) == env_mask and 0 in env_mask[0]  # the observation is not trained


def test_the_step_assembles_its_parts_in_order_and_hands_the_loss_their_outputs():
    ep = episode([1.0], [(0, 2)], 2)
    calls = []

    class Source:
        def __call__(self, rows):
            calls.append("play")
            return [{**rows[0], "prompt": ep.prompt_messages, "episode_return": 1.0}], RolloutBatch(
                [ep], [[1.0]], torch.ones(1), num_generations=1)

        def trained_mask(self, batch, env_mask):
            return env_mask

        def episode_return(self, episode):
            return 1.0

    class Policy:
        def batch_size(self, mode):
            return 1

        def old(self, x, mode):
            calls.append("old")
            return torch.full(x.completion_ids.shape, -0.5)

        def reference(self, x, mode):
            calls.append("reference")
            return torch.full(x.completion_ids.shape, -0.7)

    class Credit:
        def needs_old_logps(self):
            return True

        def needs_reference(self):
            return True

        def __call__(self, batch, x, old, ref, token_rewards):
            calls.append("credit")
            assert batch.rewards_per_func.tolist() == [[1.0]]  # scored before the credit
            assert token_rewards is None  # no distillation teacher
            return (old - ref) * x.trained, {"returns": x.trained.float()}

    def scorer(rows, batch):
        calls.append("score")
        return torch.tensor([[rows[0]["episode_return"]]])

    args = SimpleNamespace(max_failed_steps=3, steps_per_generation=1, num_iterations=1,
                           gradient_accumulation_steps=1, pad_to_multiple_of=None)
    step = MultiTurnStep(Source(), Policy(), Credit(), scorer, step_log(), args=args, accelerator=OneProcess(),
                         pad_token_id=0, eos_token_id=2, use_vllm=False)
    output = step([{"task": 0}])
    assert calls == ["play", "old", "reference", "score", "credit"]
    assert output["completion_ids"].tolist() == [[10, 11]] and output["tool_mask"].tolist() == [[1, 1]]
    assert torch.allclose(output["advantages"], torch.tensor([[0.2, 0.2]]))
    assert output["old_per_token_logps"].tolist() == [[-0.5, -0.5]] and "returns" in output
    assert output["num_items_in_batch"].item() == 2 and step.last_batch.rewards_per_func is not None
    assert step.log.metrics["train"]["episodes/mean_shaped_return"] == [1.0]
    assert math.isclose(step.log.logs["advantages"][0], 0.2, rel_tol=1e-6)


def test_the_scorer_alone_reads_the_environment_return_from_the_batch_and_calls_reward_funcs_with_trls_signature():
    won, failed = episode([1.0, 2.0], [(0, 1), (3, 5)], 5), episode([1.0], [(0, 1)], 1)
    failed.status = Status.FAILED
    batch = RolloutBatch([won, failed], [[1.0, 2.0], [1.0]], torch.tensor([1.0, 1.0]), num_generations=2)
    calls = []

    def reply_count(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **columns):
        calls.append(columns)
        return [float(len(ids)) for ids in completion_ids]

    # the rows' own `episode_return` column is a decoy: the scorer reads each episode's return from the batch
    rows = [{"prompt": [{"role": "user", "content": "go"}], "episode_return": 99.0, "task_id": i} for i in range(2)]
    scorer = Scorer([None, reply_count], ["environment_return", "reply_count"], OneProcess(),
                    lambda: SimpleNamespace(global_step=0), step_log(("environment_return", "reply_count")),
                    episode_return=lambda ep: None if ep.failed else float(sum(ep.turn_rewards)))
    scores = scorer(rows, batch)
    assert scores[0].tolist() == [3.0, 5.0] and math.isnan(scores[1, 0]) and scores[1, 1] == 1.0
    assert calls[0]["task_id"] == [0, 1]  # the rows' other columns reach reward_funcs as TRL passes them
    # step-wise: each step sample scores its episode's return; a padding row none
    steps = [StepSample(0, 0, [5], [10], [1], [0.0]), StepSample(0, 1, [5, 10, 11, 12], [13, 14], [1, 1], [0.0, 0.0]),
             None]
    stepwise = dataclasses.replace(batch, layout=StepRows(), steps=steps)
    scores = scorer([rows[0], rows[0], rows[0]], stepwise)
    assert scores[:2, 0].tolist() == [3.0, 3.0] and math.isnan(scores[2, 0])
