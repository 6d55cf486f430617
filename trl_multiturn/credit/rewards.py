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
    - `dense_scaled`: the paper's scaling of dense rewards (Wang et al. 2025, arXiv 2510.01132), so that an episode's
      total is bounded however many rewarded steps it takes. With m the episode's number of non-zero environment
      rewards,
          won:  r_k = env_k / m          (the paper's: a win returns the mean of its rewards, not their sum)
          lost: r_k = env_k / (m + 1)    (the win it did not reach counts as one more step: m/(m+1) of its mean)
      and r_k = env_k when m = 0. The paper states the scaling for won episodes only; left unscaled, a lost episode
      that collects two rewards of 1 returns 2, twice a win's 1, so a policy learns to collect partial rewards and
      stall. Scaling losses too, one step short, closes that: when the rewarded steps are worth the same r > 0 (a
      point per quest step in TextWorld's dense games), every win returns r and every loss r * m/(m+1) < r,
      however many rewards it collected. With rewards of different sizes a loss still returns at most m/(m+1) of
      its own mean, so it out-returns a win only by collecting larger rewards on average than the win did.

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
    if mode == "dense_scaled":
        nonzero = sum(r != 0 for r in rewards)
        rewards = [r / (nonzero + (not won)) for r in rewards] if nonzero else rewards
    if mode in ("sparse", "shaped") and won:
        rewards[-1] += success_reward
    if format_penalty and format_errors is not None:
        rewards = [r - format_penalty * bool(err) for r, err in zip(rewards, format_errors)]
    return rewards
