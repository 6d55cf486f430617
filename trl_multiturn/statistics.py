"""The package's statistics, on `scipy.stats` and `statsmodels`: how sure a success rate is, whether two models
differ on the same tasks, whether a recipe differs over seeds, and how many games a comparison needs.

Two models on the same tasks (`paired_test`): of the tasks where they disagree, `only_a` were won by model A alone
and `only_b` by model B alone. Under equal success probability each disagreement is a fair coin flip, so the exact
McNemar test (`mcnemar_exact`) is the two-sided binomial tail of the disagreements. Several such tests are one
family, adjusted by Holm's step-down method (`holm`).

A recipe over seeds (`seed_effect`): each seed s trains one model per recipe (or, for a fixed baseline such as the
SFT start, reuses the one model) and all are played on the same held-out games, giving a paired difference of
success rates d_s = rate_A(s) - rate_B(s). Per-run McNemar tests ask whether *that* pair of models differs; across n
seeds the question is the recipe's mean effect mu = E[d], the seed-to-seed spread included. Two tests of mu = 0:

* Student's t: t = mean(d) / (sd(d) / sqrt(n)) with n - 1 degrees of freedom (sd with divisor n - 1), and the 95%
  interval mean(d) +/- t_{0.975, n-1} sd(d) / sqrt(n). Assumes the d_s are normal; with a handful of seeds nothing can
  check that.
* The exact sign-flip (randomisation) test: under mu = 0 with d symmetric about 0 each d_s is as likely to have the
  other sign, so p = #{sign vectors e in {-1, 1}^n : |sum e_s d_s| >= |sum d_s|} / 2^n. It assumes no normality, but
  its smallest possible p is 2 / 2^n: 0.125 with 4 seeds, 0.0625 with 5, so it cannot reject at 0.05 with fewer than
  6 seeds whatever the effect.

How many paired games a comparison needs (`mcnemar_power`, `games_for_power`): two policies play the same n games.
Each game is discordant (won by exactly one of them) with probability d, the discordance, and the success rates
differ by delta (an effect of 0.10 is ten points). Given D discordant games, the games only the better policy won
are Binomial(D, pi) with

    pi = 1/2 + delta / (2 d)        (so that E[only_a - only_b] = n delta; needs |delta| <= d)

and the test rejects at level alpha when min(only_a, only_b) <= k(D), the largest k with
2 P(Binomial(D, 1/2) <= k) <= alpha. The power is

    power(n) = sum_D P(Binomial(n, d) = D) * P(reject | D)

computed exactly. With m comparisons corrected by Holm, the bound used is alpha / m (Holm's first step, which every
rejection must pass: a conservative figure for the others).

scipy and statsmodels are imported by each function, not with the module: the CLI imports this module through
`evaluation` for every command, and most commands compute no statistic.
"""

from __future__ import annotations

from dataclasses import dataclass


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion p = successes / n (statsmodels' `proportion_confint`), at
    the two-sided level whose normal quantile is `z` (1.96: 95%); (0, 1) for no trials:

        centre = (p + z^2 / 2n) / (1 + z^2 / n),  half = z * sqrt(p(1 - p)/n + z^2 / 4n^2) / (1 + z^2 / n)
    """
    from scipy.stats import norm
    from statsmodels.stats.proportion import proportion_confint

    if n == 0:
        return 0.0, 1.0
    low, high = proportion_confint(successes, n, alpha=2 * norm.sf(z), method="wilson")
    # Exactly 0 with no success and 1 with no failure; the library's rounding leaves ~1e-17 there.
    return 0.0 if successes == 0 else float(low), 1.0 if successes == n else float(high)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar test of two models played on the same tasks (statsmodels' `mcnemar`): with
    n = only_a + only_b disagreements and k = min(only_a, only_b),

        p = min(1, 2 * sum_{i=0}^{k} C(n, i) / 2^n)

    and p = 1 when the models never disagree.
    """
    from statsmodels.stats.contingency_tables import mcnemar

    return float(mcnemar([[0, only_a], [only_b, 0]], exact=True).pvalue)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of m p-values for multiple comparisons (statsmodels' `multipletests`). With the
    p-values sorted ascending, p_(1) <= ... <= p_(m), the adjusted value of the i-th smallest is

        q_(i) = min(1, max_{j <= i} (m - j + 1) * p_(j))

    returned in the order given. Rejecting every hypothesis with q < alpha keeps the chance of any false rejection
    at most alpha, whatever the dependence between the tests.
    """
    from statsmodels.stats.multitest import multipletests

    return [float(q) for q in multipletests(p_values, method="holm")[1]] if p_values else []


@dataclass(frozen=True)
class PairedTest:
    """Two models on the same tasks: how many tasks only A won, only B won, and the exact McNemar p-value."""

    only_a: int
    only_b: int
    p_value: float

    def __str__(self) -> str:
        return f"+{self.only_a}/-{self.only_b} tasks, exact McNemar p = {self.p_value:.3g}"


def paired_test(a: dict[str, bool], b: dict[str, bool]) -> PairedTest:
    """Compare per-task outcomes `a` and `b` (task key -> won) on the tasks both have, by `mcnemar_exact`."""
    tasks = a.keys() & b.keys()
    only_a = sum(a[t] and not b[t] for t in tasks)
    only_b = sum(b[t] and not a[t] for t in tasks)
    return PairedTest(only_a, only_b, mcnemar_exact(only_a, only_b))


def sign_flip_p(differences: list[float]) -> float:
    """Two-sided exact sign-flip p-value of mean 0 (module docstring): scipy's `permutation_test` of the sum over
    every sign vector. For a distribution symmetric about 0, its two-sided p, 2 min(P(T <= t), P(T >= t)) capped at
    1, is the share of sign vectors with |sum| >= |t|."""
    import numpy as np
    from scipy.stats import permutation_test

    return float(permutation_test((np.asarray(differences, dtype=float),), np.sum, permutation_type="samples",
                                  n_resamples=np.inf, vectorized=True).pvalue)


@dataclass(frozen=True)
class SeedEffect:
    """The mean of the per-seed differences, its t interval (95% by default) and the two p-values."""

    n: int
    mean: float
    sd: float
    ci_low: float
    ci_high: float
    t_p: float
    sign_flip_p: float


def seed_effect(differences: list[float], level: float = 0.95) -> SeedEffect:
    """The recipe-level effect of per-seed differences (module docstring; scipy's `ttest_1samp`); needs at least 2
    seeds. Differences that are all equal have sd 0, where t is undefined: p = 1 if they are 0, else 0."""
    import numpy as np
    from scipy.stats import ttest_1samp

    n = len(differences)
    if n < 2:
        raise ValueError(f"seed_effect needs the differences of at least 2 seeds, got {n}")
    d = np.asarray(differences, dtype=float)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return SeedEffect(n, mean, sd, mean, mean, 1.0 if mean == 0.0 else 0.0, sign_flip_p(differences))
    test = ttest_1samp(d, 0.0)
    interval = test.confidence_interval(level)
    return SeedEffect(n, mean, sd, float(interval.low), float(interval.high), float(test.pvalue),
                      sign_flip_p(differences))


def mcnemar_power(games: int, discordance: float, effect: float, alpha: float = 0.05, comparisons: int = 1) -> float:
    """Probability that the exact McNemar test on `games` paired games rejects equal success at level
    alpha / comparisons, when a game is discordant with probability `discordance` and the rates differ by `effect`
    (module docstring; scipy's `binom`)."""
    import numpy as np
    from scipy.stats import binom

    if not 0 < discordance <= 1:
        raise ValueError(f"discordance={discordance!r}: the share of games exactly one policy wins, in (0, 1]")
    if not 0 <= abs(effect) <= discordance:
        raise ValueError(f"effect={effect!r}: a difference of success rates can be at most the discordance "
                         f"({discordance}) in size")
    level = alpha / comparisons
    pi = 0.5 + abs(effect) / (2 * discordance)
    discordant = np.arange(games + 1)
    k = binom.ppf(level / 2, discordant, 0.5)  # the fewest k with P(X <= k) >= level / 2; k(D) is at most that
    k = np.where(2 * binom.cdf(k, discordant, 0.5) <= level, k, k - 1)
    reject = binom.cdf(k, discordant, pi) + binom.cdf(k, discordant, 1 - pi)  # 0 where k(D) = -1
    return min(1.0, float(np.sum(binom.pmf(discordant, games, discordance) * reject)))


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
