"""Reward modes: how an episode's per-turn rewards are formed from what the environment reported."""

from __future__ import annotations

REWARD_MODES = ("sparse", "dense", "shaped", "dense_scaled")


def shape_turn_rewards(
    env_rewards: list[float],
    won: bool,
    mode: str,
    success_reward: float = 1.0,
    format_errors: list[bool] | None = None,
    format_penalty: float = 0.0,
) -> list[float]:
    """Per-turn rewards r_k for one episode of K turns.

    - `sparse`: r_k = 0 for k < K-1 and r_{K-1} = success_reward * won (success at the final turn only);
    - `dense`:  r_k = the environment's reward for turn k (e.g. a TextWorld score delta);
    - `shaped`: dense, plus success_reward * won on the final turn;
    - `dense_scaled`: the paper's scaling of dense rewards (Wang et al. 2025, arXiv 2510.01132): in a won episode,
      each turn's environment reward divided by the episode's number of non-zero environment rewards m,
      r_k = env_k / m, so a win returns the mean of its rewards rather than their sum and a win reached through many
      rewarded steps is not worth more than a direct one; a lost episode (or one with m = 0) keeps r_k = env_k.
      Known hole, kept as the issue specified it: a lost episode that collects two rewards of 1 returns 2, more than
      a win whose rewards average 1, so a policy can prefer partial progress to winning. Use it only for the paper's
      reward study, not as a default.

    Every mode then subtracts `format_penalty` on each turn whose reply the action parser could not read.
    """
    if mode not in REWARD_MODES:
        raise ValueError(f"reward_mode={mode!r}: choose one of {REWARD_MODES}")
    k = len(env_rewards)
    if k == 0:
        return []
    if mode == "sparse":
        rewards = [0.0] * k
    else:
        rewards = [float(r) for r in env_rewards]
    if mode == "dense_scaled" and won:
        nonzero = sum(r != 0 for r in rewards)
        rewards = [r / nonzero for r in rewards] if nonzero else rewards
    if mode in ("sparse", "shaped") and won:
        rewards[-1] += success_reward
    if format_penalty and format_errors is not None:
        rewards = [r - format_penalty * bool(err) for r, err in zip(rewards, format_errors)]
    return rewards
