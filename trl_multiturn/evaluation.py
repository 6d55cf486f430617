"""`evaluate(model, env, tasks)`: greedy success rate with a confidence interval, outside any trainer."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .rollout.episode import Episode
from .rollout.history import get_history

EVAL_RESULTS_FILE = "eval_results.json"
GROUP_COLUMNS = ("task_type", "challenge", "world_size", "nb_objects", "quest_length", "repo")
"""Task-row columns the summary is broken down by, where the rows have them (ALFWorld's task type, TextWorld's
game kind and complexity, SWE-Gym's repository)."""

_DEFAULTS = {"max_turns": 8, "max_completion_length": 32, "max_episode_tokens": None, "system_prompt": None,
             "action_parser": "first_line", "chat_template_kwargs": None, "history": None}


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
    mean_return: float = 0.0
    settings: dict = field(default_factory=dict, repr=False)

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else float("nan")

    def won_by_task(self) -> dict[str, bool]:
        """Won or not per task (keyed by the task row as JSON), failed episodes left out: what `paired_test`
        pairs when two models played the same tasks."""
        return {json.dumps(ep.task, sort_keys=True, default=str): bool(ep.won) for ep in self.episodes
                if not ep.failed}

    def __str__(self) -> str:
        return (f"success {self.successes}/{self.n} = {self.success_rate:.1%} "
                f"(95% CI {self.ci_low:.1%}-{self.ci_high:.1%}), mean turns {self.mean_turns:.1f}, "
                f"mean return {self.mean_return:.2f}, failed {self.failed}")

    @classmethod
    def from_episodes(cls, episodes: list[Episode], settings: dict | None = None) -> EvalResult:
        """Failed episodes are counted apart and left out of success, turns and return."""
        scored = [ep for ep in episodes if not ep.failed]
        wins = sum(ep.won for ep in scored)
        low, high = wilson_interval(wins, len(scored))
        n = max(1, len(scored))
        return cls(wins, len(scored), low, high, sum(ep.num_turns for ep in scored) / n,
                   len(episodes) - len(scored), episodes, sum(sum(ep.turn_rewards) for ep in scored) / n,
                   dict(settings or {}))

    def summary(self, by_group: bool = True) -> dict:
        """Success rate, Wilson interval, mean turns and return, counts; with `by_group`, the same per value of each
        `GROUP_COLUMNS` column the tasks have (`by_task_type`, `by_quest_length`, ...)."""
        out = {"success_rate": self.success_rate if self.n else None, "successes": self.successes, "n": self.n,
               "ci_low": self.ci_low, "ci_high": self.ci_high, "mean_turns": self.mean_turns,
               "mean_return": self.mean_return, "failed": self.failed}
        for column in GROUP_COLUMNS if by_group else ():
            values = sorted({str(ep.task[column]) for ep in self.episodes if ep.task.get(column) is not None})
            if values:
                out[f"by_{column}"] = {
                    value: EvalResult.from_episodes(
                        [ep for ep in self.episodes if str(ep.task.get(column)) == value]).summary(by_group=False)
                    for value in values
                }
        return out

    def outcomes(self) -> list[dict]:
        """One record per played task: its row's JSON-able fields, how the episode went, each turn's reward, and
        the conversation as the model saw it (what `trl-multiturn episodes` shows)."""
        return [{"task": {k: v for k, v in ep.task.items() if isinstance(v, (str, int, float, bool))},
                 "won": ep.won, "failed": ep.failed, "failure": ep.failure, "truncated": ep.truncated,
                 "num_turns": ep.num_turns, "return": sum(ep.turn_rewards), "actions": list(ep.actions),
                 "turn_rewards": list(ep.turn_rewards), "messages": ep.messages()}
                for ep in self.episodes]

    def to_dataset(self):
        """The played episodes as a `datasets.Dataset`, one row per task (`trl_multiturn.episode_data`): e.g. keep
        the won ones (`.filter(lambda row: row["won"])`) for rejection-sampling SFT with `MultiTurnSFTTrainer`."""
        from .episode_data import episodes_to_dataset

        return episodes_to_dataset(self.episodes)

    def save(self, output_dir: str | os.PathLike, name: str = EVAL_RESULTS_FILE, **extra) -> Path:
        """Write `name` (default `eval_results.json`: summary, episode settings, per-task outcomes, `extra`) to
        `output_dir`."""
        path = Path(output_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"summary": self.summary(), "settings": self.settings, **extra, "outcomes": self.outcomes()}
        path.write_text(json.dumps(record, indent=2, default=str) + "\n")
        return path


def load_eval_results(output_dir: str | os.PathLike) -> list[dict]:
    """Every evaluation kept in a model folder: the training run's `eval_results.json` first, then each
    `trl-multiturn eval` result (`eval_results_<key>.json`) in name order."""
    folder = Path(output_dir)
    paths = [folder / EVAL_RESULTS_FILE, *sorted(folder.glob(f"{Path(EVAL_RESULTS_FILE).stem}_*.json"))]
    return [{**json.loads(path.read_text()), "file": path.name} for path in paths if path.is_file()]


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


def resolve_episode_settings(model, episode_settings: dict | str | os.PathLike | None = None, **explicit) -> dict:
    """The episode settings an evaluation plays with: each explicit (not None) value, else the saved one
    (`episode_settings` as a dict or a folder; by default the folder `model` names, when it is a path), else the
    default. The saved environment spec is kept under "environment"."""
    from .episode_settings import load_episode_settings

    if episode_settings is None and isinstance(model, (str, os.PathLike)):
        episode_settings = model
    saved = episode_settings if isinstance(episode_settings, dict) else load_episode_settings(episode_settings)
    settings = {name: explicit[name] if explicit.get(name) is not None else saved.get(name, default)
                for name, default in _DEFAULTS.items()}
    settings["environment"] = saved.get("environment")
    return settings


def evaluate(model, environment_factory, tasks, tokenizer=None, *, max_turns: int | None = None,
             max_reply_tokens: int | None = None, max_episode_tokens: int | None = None, temperature: float = 0.0,
             system_prompt: str | None = None, action_parser=None, chat_template_kwargs: dict | None = None,
             history: str | None = None, batch_size: int = 16, env_mode: str = "auto",
             env_timeout: float | None = None, episode_settings: dict | str | os.PathLike | None = None,
             progress: bool = True) -> EvalResult:
    """Play every task once and report success. Greedy by default (`temperature=0`), independent of training
    sampling. `model` is a model object or a path/Hub id; `tasks` is a list of rows or a `datasets.Dataset`.
    Failed episodes (environment crashes) are counted apart and left out of the success rate.

    Episode settings left None (`max_turns`, `max_reply_tokens`, `max_episode_tokens`, `system_prompt`,
    `action_parser`, `chat_template_kwargs`, `history`) and `environment_factory=None` come from
    `episode_settings.json`, the file every trainer saves with a model: in `episode_settings` (a folder, or the dict
    itself), by default in the folder `model` names; without one, the defaults (8 turns, 32 tokens a reply,
    `first_line`, the trajectory format). `history` (a `trl_multiturn.rollout.history` spelling such as "window:2")
    plays the step-wise format: each turn's context is that policy's view of the episode, as a model trained with
    `episode_format="stepwise"` saw it. `progress` shows a progress bar over the tasks."""
    # The engine (torch, transformers) is imported here, not with the module: the CLI imports this module for its
    # statistics and result files, and `trl-multiturn serve` must start without torch.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .episode_settings import environment_factory_from_spec
    from .models import resolve_model
    from .progress import TurnProgress
    from .rollout.generation import CachedGenerator, generation_eos_ids, reply_eos_ids
    from .rollout.runner import EpisodeRunner

    settings = resolve_episode_settings(
        model, episode_settings, max_turns=max_turns, max_completion_length=max_reply_tokens,
        max_episode_tokens=max_episode_tokens, system_prompt=system_prompt, action_parser=action_parser,
        chat_template_kwargs=chat_template_kwargs, history=history)
    if environment_factory is None:
        environment_factory = environment_factory_from_spec(settings["environment"])
    if isinstance(model, str):
        path = resolve_model(model)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    if tokenizer is None:
        raise ValueError("evaluate(model=<object>) needs `tokenizer=`; pass the model's tokenizer.")
    was_training = model.training
    model.eval()
    eos = reply_eos_ids(tokenizer, generation_eos_ids(model))
    runner = EpisodeRunner(
        environment_factory, tokenizer, CachedGenerator(model, tokenizer, eos, temperature=temperature),
        max_turns=settings["max_turns"], max_reply_tokens=settings["max_completion_length"],
        max_episode_tokens=settings["max_episode_tokens"], action_parser=settings["action_parser"],
        system_prompt=settings["system_prompt"], eos_token_ids=eos,
        chat_template_kwargs=settings["chat_template_kwargs"], env_mode=env_mode, env_timeout=env_timeout,
        history=get_history(settings["history"]) if settings["history"] is not None else None,
    )
    rows = list(tasks)
    episodes: list[Episode] = []
    try:
        with TurnProgress("evaluate", total=len(rows), enabled=progress, unit="task") as runner.on_progress:
            for start in range(0, len(rows), batch_size):
                episodes += runner(rows[start: start + batch_size])
    finally:
        runner.close()
        model.train(was_training)
    return EvalResult.from_episodes(episodes, {**settings, "temperature": temperature})


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


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of m p-values for multiple comparisons (family-wise error rate).

    With the p-values sorted ascending, p_(1) <= ... <= p_(m), the adjusted value of the i-th smallest is

        q_(i) = min(1, max_{j <= i} (m - j + 1) * p_(j))

    returned in the order given. Rejecting every hypothesis with q < alpha keeps the chance of any false rejection
    at most alpha, whatever the dependence between the tests.
    """
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


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
