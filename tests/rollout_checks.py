"""Checks of the rollout invariants, shared by the tests of every environment (toy, TextWorld, ALFWorld, SWE)."""

import torch

from trl_multiturn.rollout import Episode
from trl_multiturn.trainers.batch import RolloutBatch
from trl_multiturn.trainers.rows import StepSample


def assert_token_exact(model, episode: Episode) -> None:
    """Every sampled token (mask 1) is the model's argmax given exactly the tokens before it.

    Holds for greedy (top_k=1) rollouts: it fails if any history token was decoded and re-encoded differently, or
    if a sampled token was dropped, added or moved.
    """
    ids = torch.tensor([episode.prompt_ids + episode.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    p = len(episode.prompt_ids)
    predicted = logits[p - 1: p - 1 + len(episode.completion_ids)].argmax(-1).tolist()
    sampled = [t for t, m in zip(episode.completion_ids, episode.env_mask) if m]
    argmax = [t for t, m in zip(predicted, episode.env_mask) if m]
    assert sampled == argmax


def step_samples_of(episodes: list[Episode]) -> list[StepSample]:
    """The step-wise training samples of `episodes`, one per turn (episode then turn order)."""
    return RolloutBatch(episodes=episodes, turn_rewards=[], reward_weights=torch.ones(1),
                        num_generations=1).step_samples()


def assert_sample_token_exact(model, sample: StepSample) -> None:
    """Step-wise: every trained token is the model's greedy choice given exactly the recorded context and the reply
    before it, and the sample trains on its whole reply and nothing else."""
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    p = len(sample.prompt_ids)
    assert sample.completion_ids == logits[p - 1: p - 1 + len(sample.completion_ids)].argmax(-1).tolist()
    assert sample.mask == [1] * len(sample.completion_ids)


def assert_env_mask_exact(tokenizer, episode: Episode) -> None:
    """Mask 1 covers exactly the turn spans; the observations appear only in mask-0 text; each span decodes to
    its turn's reply."""
    in_spans = [0] * len(episode.completion_ids)
    for start, end in episode.turn_spans:
        in_spans[start:end] = [1] * (end - start)
    assert episode.env_mask == in_spans
    for (start, end), reply in zip(episode.turn_spans, episode.replies):
        assert tokenizer.decode(episode.completion_ids[start:end], skip_special_tokens=True) == reply
    env_text = tokenizer.decode([t for t, m in zip(episode.completion_ids, episode.env_mask) if not m])
    model_text = tokenizer.decode([t for t, m in zip(episode.completion_ids, episode.env_mask) if m])
    # The observation after turn k is appended only when a turn k+1 follows.
    for obs in episode.observations[: max(0, episode.num_turns - 1)]:
        assert obs.strip() in env_text
        if len(obs.strip()) > 8:
            assert obs.strip() not in model_text


def same_episode(episode: Episode, reference: Episode) -> bool:
    """The same tokens, masks, turns, rewards, observations and outcome: what two schedules of one greedy rollout
    must agree on (the order of their generate calls aside)."""
    return (episode.completion_ids == reference.completion_ids and episode.env_mask == reference.env_mask
            and episode.turn_spans == reference.turn_spans and episode.turn_rewards == reference.turn_rewards
            and episode.observations == reference.observations
            and (episode.won, episode.done, episode.truncated, episode.failed)
            == (reference.won, reference.done, reference.truncated, reference.failed))
