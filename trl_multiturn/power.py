"""How many paired held-out games a comparison needs: the power of the exact McNemar test (`evaluation.mcnemar_exact`).

Two policies play the same n games. Each game is discordant (won by exactly one of them) with probability d, the
discordance, and the success rates differ by delta (an effect of 0.10 is ten points). Given D discordant games, the
games only the better policy won are Binomial(D, pi) with

    pi = 1/2 + delta / (2 d)        (so that E[only_a - only_b] = n delta; needs |delta| <= d)

and the test rejects at level alpha when min(only_a, only_b) <= k(D), the largest k with
2 P(Binomial(D, 1/2) <= k) <= alpha. The power is

    power(n) = sum_D P(Binomial(n, d) = D) * P(reject | D)

computed exactly. With m comparisons corrected by Holm, the bound used is alpha / m (Holm's first step, which every
rejection must pass: a conservative figure for the others).
"""

from __future__ import annotations

import math


def _log_pmf(n: int, k: int, p: float) -> float:
    """log P(Binomial(n, p) = k)."""
    if p in (0.0, 1.0):
        return 0.0 if k == (n if p == 1.0 else 0) else -math.inf
    log_choose = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return log_choose + k * math.log(p) + (n - k) * math.log1p(-p)


def _cdf(n: int, k: int, p: float) -> float:
    """P(Binomial(n, p) <= k)."""
    return min(1.0, sum(math.exp(_log_pmf(n, i, p)) for i in range(k + 1))) if k >= 0 else 0.0


def _critical(discordant: int, alpha: float) -> int:
    """k(D): the largest k with 2 P(Binomial(D, 1/2) <= k) <= alpha (-1 when even k = 0 is not rejected)."""
    k, tail = -1, 0.0
    while k + 1 <= discordant // 2:
        tail += math.exp(_log_pmf(discordant, k + 1, 0.5))
        if 2 * tail > alpha:
            break
        k += 1
    return k


def mcnemar_power(games: int, discordance: float, effect: float, alpha: float = 0.05, comparisons: int = 1) -> float:
    """Probability that the exact McNemar test on `games` paired games rejects equal success at level
    alpha / comparisons, when a game is discordant with probability `discordance` and the rates differ by `effect`."""
    if not 0 < discordance <= 1:
        raise ValueError(f"discordance={discordance!r}: the share of games exactly one policy wins, in (0, 1]")
    if not 0 <= abs(effect) <= discordance:
        raise ValueError(f"effect={effect!r}: a difference of success rates can be at most the discordance "
                         f"({discordance}) in size")
    level = alpha / comparisons
    pi = 0.5 + abs(effect) / (2 * discordance)
    power = 0.0
    for discordant in range(games + 1):
        weight = math.exp(_log_pmf(games, discordant, discordance))
        if weight < 1e-12:
            continue
        k = _critical(discordant, level)
        if k < 0:
            continue
        power += weight * (_cdf(discordant, k, pi) + _cdf(discordant, k, 1 - pi))
    return min(1.0, power)


def games_for_power(discordance: float, effect: float, power: float = 0.8, alpha: float = 0.05,
                    comparisons: int = 1, most: int = 20_000) -> int | None:
    """The fewest paired games whose `mcnemar_power` reaches `power` (None above `most`). The exact test's power is
    not monotone in n (it steps with the discrete critical values), so the answer is the first n of a scan in steps
    of 1% after a doubling search."""
    if not 0 < power < 1:
        raise ValueError(f"power={power!r}: a probability in (0, 1)")
    high = 16
    while mcnemar_power(high, discordance, effect, alpha, comparisons) < power:
        high *= 2
        if high > most:
            return None
    low = high // 2
    step = max(1, low // 100)
    for games in range(low, high + 1, step):
        if mcnemar_power(games, discordance, effect, alpha, comparisons) >= power:
            return games
    return high
