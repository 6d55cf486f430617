"""A recipe's effect across seeds: is training recipe A better than B, not just this one run of it?

Each seed s trains one model per recipe (or, for a fixed baseline such as the SFT start, reuses the one model) and
all are played on the same held-out games, giving a paired difference of success rates d_s = rate_A(s) - rate_B(s).
Per-run McNemar tests ask whether *that* pair of models differs; across n seeds the question is the recipe's mean
effect mu = E[d], the seed-to-seed spread included. Two tests of mu = 0 on the n differences:

* Student's t: t = mean(d) / (sd(d) / sqrt(n)) with n - 1 degrees of freedom (sd with divisor n - 1), and the 95%
  interval mean(d) +/- t_{0.975, n-1} sd(d) / sqrt(n). Assumes the d_s are normal; with a handful of seeds nothing can
  check that.
* The exact sign-flip (randomisation) test: under mu = 0 with d symmetric about 0 each d_s is as likely to have the
  other sign, so p = #{sign vectors e in {-1, 1}^n : |sum e_s d_s| >= |sum d_s|} / 2^n. It assumes no normality, but
  its smallest possible p is 2 / 2^n: 0.125 with 4 seeds, 0.0625 with 5, so it cannot reject at 0.05 with fewer than
  6 seeds whatever the effect.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, by its continued fraction (Lentz's method), evaluated on
    the side of x where it converges fast: I_x(a, b) = 1 - I_{1-x}(b, a)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - regularized_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2:
            numerator = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            numerator = (m * (b - m) * x) / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom: 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2 for t >= 0, and by
    symmetry for t < 0."""
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(q: float, df: float) -> float:
    """The t with P(T <= t) = q (0 < q < 1), by bisection on `student_t_cdf`."""
    low, high = -1e3, 1e3
    for _ in range(200):
        mid = (low + high) / 2.0
        low, high = (mid, high) if student_t_cdf(mid, df) < q else (low, mid)
    return (low + high) / 2.0


def sign_flip_p(differences: list[float]) -> float:
    """Two-sided exact sign-flip p-value of mean 0 (formula in the module docstring); 1 for no data."""
    observed = abs(sum(differences))
    flips = list(itertools.product((-1, 1), repeat=len(differences)))
    extreme = sum(abs(sum(e * d for e, d in zip(signs, differences))) >= observed - 1e-12 for signs in flips)
    return extreme / len(flips)


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
    """The recipe-level effect of per-seed differences (module docstring); needs at least 2 seeds."""
    n = len(differences)
    if n < 2:
        raise ValueError(f"seed_effect needs the differences of at least 2 seeds, got {n}")
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    half = student_t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    if sd == 0.0:
        t_p = 1.0 if mean == 0.0 else 0.0
    else:
        t_p = 2.0 * (1.0 - student_t_cdf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    return SeedEffect(n, mean, sd, mean - half, mean + half, t_p, sign_flip_p(differences))
