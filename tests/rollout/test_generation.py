"""`CachedGenerator`: each episode's key/value cache carried from turn to turn gives what `model.generate` gives."""

import pytest
import torch
from rollout_checks import assert_env_mask_exact, assert_token_exact
from toy_envs import CountingEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiturn.rollout import EpisodeRunner
from trl_multiturn.rollout.generation import CachedGenerator, hf_generate_fn
from trl_multiturn.rollout.rules import EpisodeRules


def play(path, generate_factory, rows):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(path)
    runner = EpisodeRunner(CountingEnv, tokenizer, generate_factory(model, tokenizer),
                           EpisodeRules(max_turns=4, max_completion_length=6, action_parser=lambda reply: "go"))
    return model, tokenizer, runner(rows)


def test_greedy_episodes_equal_model_generate_and_every_token_is_fed_once(tiny_model):
    rows = [{"target": 3}, {"target": 1}, {"target": 5}]
    fed = []

    def cached(model, tokenizer):
        generator = CachedGenerator(model, tokenizer)
        forward = model.forward

        def counting_forward(*args, **kwargs):
            fed.append(kwargs["input_ids"].shape[1])
            return forward(*args, **kwargs)

        model.forward = counting_forward
        return generator

    _, _, reference = play(tiny_model, lambda m, t: hf_generate_fn(m, t, batch_size=1), rows)
    model, tokenizer, episodes = play(tiny_model, cached, rows)
    fed_in_rollout = sum(fed)
    for ep, ref in zip(episodes, reference):
        assert ep.completion_ids == ref.completion_ids and ep.env_mask == ref.env_mask
        assert_token_exact(model, ep)
        assert_env_mask_exact(tokenizer, ep)
    # The batch is fed once per token position, each turn only the tokens appended since the last (re-reading the
    # history at every turn would feed the longest episode's prompt once per turn).
    assert fed_in_rollout <= max(ep.num_tokens for ep in episodes)


def test_sampling_is_seeded_and_differs_from_greedy(tiny_model):
    rows = [{"target": 4}] * 3
    torch.manual_seed(0)
    _, _, first = play(tiny_model, lambda m, t: CachedGenerator(m, t, temperature=1.5), rows)
    torch.manual_seed(0)
    _, _, again = play(tiny_model, lambda m, t: CachedGenerator(m, t, temperature=1.5), rows)
    _, _, greedy = play(tiny_model, CachedGenerator, rows)
    assert [ep.completion_ids for ep in first] == [ep.completion_ids for ep in again]
    assert len({tuple(ep.completion_ids) for ep in greedy}) == 1
    assert len({tuple(ep.completion_ids) for ep in first}) > 1


@pytest.mark.parametrize("trainer_name", ["grpo", "rloo"])
def test_trainer_rollouts_from_the_history_cache_equal_trls_generate(tiny_chatml_model, tmp_path, trainer_name):
    """top_k=1 makes sampling greedy: the cached path and TRL's `generate` must then play identical episodes."""
    from conftest import tiny_rl_args
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnRLOOConfig, MultiTurnRLOOTrainer

    trainer_cls, config_cls = {"grpo": (MultiTurnGRPOTrainer, MultiTurnGRPOConfig),
                               "rloo": (MultiTurnRLOOTrainer, MultiTurnRLOOConfig)}[trainer_name]
    rows = [{"target": 3}, {"target": 1}, {"target": 2}, {"target": 3}]
    played = {}
    for cached in (True, False):
        args = tiny_rl_args(config_cls, tmp_path / str(cached), top_k=1, cache_episode_history=cached, max_turns=3)
        trainer = trainer_cls(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                              train_dataset=Dataset.from_list(rows))
        assert (trainer.generation.history_cache is not None) == cached
        trainer.model.eval()
        _, batch = trainer.step.episodes(rows)
        played[cached] = batch.episodes
    for ep, ref in zip(played[True], played[False]):
        assert ep.completion_ids == ref.completion_ids and ep.env_mask == ref.env_mask


def test_unsupported_sampling_settings_use_trls_generation(tiny_chatml_model, tmp_path):
    from conftest import tiny_rl_args
    from datasets import Dataset

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, repetition_penalty=1.3)
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=CountingEnv,
                                   train_dataset=Dataset.from_list([{"target": 2}] * 2))
    assert trainer.generation.history_cache is None


def test_the_history_cache_refuses_a_model_whose_layers_stream():
    """Gated DeltaNet (Qwen3.5) carries a state from token to token: a chunk's left padding would enter it mid-row
    (and transformers' DynamicCache() holds no such state): refused in one line naming the layer, and evaluation and
    the trainers generate with the padded `generate` instead (tests/trainers/test_model_matrix.py)."""
    from trl_multiturn.model_families import build_model, build_tokenizer, family

    tokenizer = build_tokenizer(family("Qwen3.5"))
    with pytest.raises(ValueError, match=r"^Qwen3_5ForCausalLM \(qwen3_5_text\) has layer_types \['linear_attention'\]"
                                         r".*Qwen3_5GatedDeltaNet.*cannot feed in padded chunks"):
        CachedGenerator(build_model(family("Qwen3.5"), tokenizer), tokenizer)
