"""`evaluate(model, env, tasks)`: greedy success rate with a confidence interval, outside any trainer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .rollout.episode import Episode
from .rollout.rules import EpisodeRules
from .statistics import wilson_interval

EVAL_RESULTS_FILE = "eval_results.json"
GROUP_COLUMNS = ("task_type", "challenge", "world_size", "nb_objects", "quest_length", "repo")
"""Task-row columns the summary is broken down by, where the rows have them (ALFWorld's task type, TextWorld's
game kind and complexity, SWE-Gym's repository)."""


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
        """Won or not per task (keyed by the task row as JSON), failed episodes left out: what `statistics.paired_test`
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


def evaluate(model, environment_factory, tasks, tokenizer=None, *, rules: EpisodeRules | None = None,
             temperature: float = 0.0, batch_size: int = 16, env_mode: str = "auto", env_timeout: float | None = None,
             episode_settings: dict | str | os.PathLike | None = None, progress: bool = True) -> EvalResult:
    """Play every task once and report success. Greedy by default (`temperature=0`), independent of training
    sampling. `model` is a model object or a path/Hub id; `tasks` is a list of rows or a `datasets.Dataset`.
    Failed episodes (environment crashes) are counted apart and left out of the success rate.

    The episodes are played by `rules` (`trl_multiturn.rollout.rules.EpisodeRules`), taken whole. Without them, by
    the rules the model was trained by, read from `episode_settings.json`, the file every trainer saves with a
    model: in `episode_settings` (a folder, or the dict itself), by default in the folder `model` names; without one,
    `EpisodeRules()`' defaults. To change one rule of the saved ones: `rules=dataclasses.replace(
    saved_rules(folder), max_turns=4)` (`trl_multiturn.episode_settings.saved_rules`). `environment_factory=None`
    plays the environment the same file names. `progress` shows a progress bar over the tasks. An
    `AgentEnvironment` (`trl_multiturn.agents`) as `environment_factory` evaluates the agent: it plays each task
    through the chat endpoint, served by `model` at `temperature`, and its returned verdict (`won`) is the success."""
    # The engine (torch, transformers) is imported here, not with the module: the CLI imports this module for its
    # statistics and result files, and `trl-multiturn serve` must start without torch.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .agents import AgentEnvironment, AgentRunner
    from .episode_settings import environment_factory_from_spec, load_episode_settings
    from .model_layers import streaming_layers
    from .models import resolve_model
    from .progress import TurnProgress
    from .rollout.generation import CachedGenerator, generation_eos_ids, hf_generate_fn, reply_eos_ids
    from .rollout.runner import EpisodeRunner

    if episode_settings is None and isinstance(model, (str, os.PathLike)):
        episode_settings = model
    saved = episode_settings if isinstance(episode_settings, dict) else load_episode_settings(episode_settings)
    rules = rules if rules is not None else EpisodeRules.from_dict(saved)
    if environment_factory is None:
        environment_factory = environment_factory_from_spec(saved.get("environment"))
    if isinstance(model, str):
        path = resolve_model(model)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    if tokenizer is None:
        raise ValueError("evaluate(model=<object>) needs `tokenizer=`; pass the model's tokenizer.")
    was_training = model.training
    model.eval()
    eos = reply_eos_ids(tokenizer, generation_eos_ids(model))
    if isinstance(environment_factory, AgentEnvironment):  # the agent plays each task through the chat endpoint
        runner = AgentRunner(environment_factory, tokenizer, hf_generate_fn(model, tokenizer, eos, temperature), rules,
                             eos_token_ids=eos)
    else:
        generate = (CachedGenerator(model, tokenizer, eos, temperature=temperature) if streaming_layers(model) is None
                    else hf_generate_fn(model, tokenizer, eos, temperature=temperature))  # Mamba, Gated DeltaNet...
        runner = EpisodeRunner(environment_factory, tokenizer, generate, rules, eos_token_ids=eos, env_mode=env_mode,
                               env_timeout=env_timeout)
    rows = list(tasks)
    episodes: list[Episode] = []
    try:
        with TurnProgress("evaluate", total=len(rows), enabled=progress, unit="task") as runner.on_progress:
            for start in range(0, len(rows), batch_size):
                episodes += runner(rows[start: start + batch_size])
    finally:
        runner.close()
        model.train(was_training)
    return EvalResult.from_episodes(episodes, {**rules.to_dict(), "environment": saved.get("environment"),
                                               "temperature": temperature})
