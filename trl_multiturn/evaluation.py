"""`evaluate(model, env, tasks)`: greedy success rate with a confidence interval, outside any trainer."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .rollout import Episode, MultiTurnRolloutCollator
from .rollout.generation import CachedGenerator, generation_eos_ids, reply_eos_ids


@dataclass
class EvalResult:
    """Success over `n` episodes with a Wilson score interval (95% by default)."""

    successes: int
    n: int
    ci_low: float
    ci_high: float
    mean_turns: float
    failed: int
    episodes: list[Episode] = field(default_factory=list, repr=False)

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else float("nan")

    def outcomes(self) -> dict[str, bool]:
        """Won or not per task (keyed by the task row as JSON), failed episodes left out: what `paired_test`
        pairs when two models played the same tasks."""
        return {json.dumps(ep.task, sort_keys=True, default=str): bool(ep.won) for ep in self.episodes
                if not ep.failed}

    def __str__(self) -> str:
        return (f"success {self.successes}/{self.n} = {self.success_rate:.1%} "
                f"(95% CI {self.ci_low:.1%}-{self.ci_high:.1%}), mean turns {self.mean_turns:.1f}, "
                f"failed {self.failed}")


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion p = successes / n:

        centre = (p + z^2 / 2n) / (1 + z^2 / n),  half = z * sqrt(p(1 - p)/n + z^2 / 4n^2) / (1 + z^2 / n)
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def evaluate(model, environment_factory, tasks, tokenizer=None, *, max_turns: int = 8, max_reply_tokens: int = 32,
             max_episode_tokens: int | None = None, temperature: float = 0.0, system_prompt: str | None = None,
             action_parser="first_line", batch_size: int = 16, env_mode: str = "auto",
             env_timeout: float | None = None) -> EvalResult:
    """Play every task once and report success. Greedy by default (`temperature=0`), independent of training
    sampling. `model` is a model object or a path/Hub id; `tasks` is a list of rows or a `datasets.Dataset`.
    Failed episodes (environment crashes) are counted apart and left out of the success rate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .models import resolve_model

    if isinstance(model, str):
        path = resolve_model(model)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    if tokenizer is None:
        raise ValueError("evaluate(model=<object>) needs `tokenizer=`; pass the model's tokenizer.")
    was_training = model.training
    model.eval()
    eos = reply_eos_ids(tokenizer, generation_eos_ids(model))
    collator = MultiTurnRolloutCollator(
        environment_factory, tokenizer, CachedGenerator(model, tokenizer, eos, temperature=temperature),
        max_turns=max_turns, max_reply_tokens=max_reply_tokens, max_episode_tokens=max_episode_tokens,
        action_parser=action_parser, system_prompt=system_prompt, eos_token_ids=eos,
        env_mode=env_mode, env_timeout=env_timeout,
    )
    rows = list(tasks)
    episodes: list[Episode] = []
    try:
        for start in range(0, len(rows), batch_size):
            episodes += collator(rows[start: start + batch_size])
    finally:
        collator.close()
        model.train(was_training)
    scored = [ep for ep in episodes if not ep.failed]
    wins = sum(ep.won for ep in scored)
    low, high = wilson_interval(wins, len(scored))
    mean_turns = sum(ep.num_turns for ep in scored) / len(scored) if scored else 0.0
    return EvalResult(wins, len(scored), low, high, mean_turns, len(episodes) - len(scored), episodes)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar test of two models played on the same tasks.

    Of the tasks where the two disagree, `only_a` were won by model A alone and `only_b` by model B alone. Under the
    null hypothesis (equal success probability) each disagreement is a fair coin flip, so with n = only_a + only_b
    and k = min(only_a, only_b):

        p = min(1, 2 * sum_{i=0}^{k} C(n, i) / 2^n)

    and p = 1 when the models never disagree.
    """
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


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
