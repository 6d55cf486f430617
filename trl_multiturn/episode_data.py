"""Played episodes as a `datasets.Dataset`: for inspection, and for rejection-sampling SFT.

`episodes_to_dataset(episodes)` gives one row per episode:

- `messages`: the conversation the model saw, ending on its last reply ([system,] user, assistant, user, ...,
  assistant), the format `MultiTurnSFTTrainer` trains on; the observation after the last reply is `final_observation`;
- `turn_rewards` (the environment's reward per turn), `return` (their sum), `won`, `truncated`, `failed`, `failure`,
  `num_turns`, `actions` (None where a reply held no readable action);
- `task`: the task row as JSON (rows of different environments have different columns);
- `prompt_ids`, `completion_ids`, `env_mask`: the exact tokens played (the sampled ones under `env_mask` 1), for
  token-level analysis. They are not named `input_ids`, so SFT re-tokenizes `messages` with its own tokenizer.

Rejection sampling: keep the won episodes (`dataset.filter(lambda row: row["won"])`) and pass them to
`MultiTurnSFTTrainer(train_dataset=...)`. Trainers save each rollout's episodes with `save_episodes=True`
(`output_dir/episodes/`, read back with `load_episodes`); `EvalResult.to_dataset()` gives an evaluation's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from .rollout.episode import Episode

EPISODES_DIR = "episodes"


def episode_record(ep: Episode) -> dict:
    """One episode as a dataset row (see the module docstring for the columns)."""
    messages, final_observation = ep.messages(), None
    if ep.replies and len(ep.observations) >= len(ep.replies):  # the last reply was answered: split that off
        final_observation = messages.pop()["content"]
    return {
        "messages": messages,
        "final_observation": final_observation,
        "turn_rewards": [float(r) for r in ep.turn_rewards],
        "return": float(sum(ep.turn_rewards)),
        "won": bool(ep.won),
        "truncated": bool(ep.truncated),
        "failed": bool(ep.failed),
        "failure": ep.failure,
        "num_turns": ep.num_turns,
        "actions": list(ep.actions),
        "task": json.dumps(ep.task, sort_keys=True, default=str),
        "prompt_ids": list(ep.prompt_ids),
        "completion_ids": list(ep.completion_ids),
        "env_mask": list(ep.env_mask),
    }


def episodes_to_dataset(episodes: Iterable[Episode]):
    """A `datasets.Dataset` with one row per episode (failed ones included, with `failed` set)."""
    import datasets

    return datasets.Dataset.from_list([episode_record(ep) for ep in episodes], features=_features())


def _features():
    import datasets

    message = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    ints = datasets.Sequence(datasets.Value("int64"))
    return datasets.Features({
        "messages": datasets.List(message), "final_observation": datasets.Value("string"),
        "turn_rewards": datasets.Sequence(datasets.Value("float64")), "return": datasets.Value("float64"),
        "won": datasets.Value("bool"), "truncated": datasets.Value("bool"), "failed": datasets.Value("bool"),
        "failure": datasets.Value("string"), "num_turns": datasets.Value("int64"),
        "actions": datasets.Sequence(datasets.Value("string")), "task": datasets.Value("string"),
        "prompt_ids": ints, "completion_ids": ints, "env_mask": ints,
    })


def save_episodes(episodes: list[Episode], output_dir: str | os.PathLike, name: str) -> Path:
    """Write `episodes` to `output_dir/episodes/<name>.parquet` (a name already taken gets a `-1`, `-2`, ...
    suffix, so several rollouts within one step are all kept); returns the path."""
    folder = Path(output_dir) / EPISODES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path, k = folder / f"{name}.parquet", 0
    while path.exists():
        k += 1
        path = folder / f"{name}-{k}.parquet"
    episodes_to_dataset(episodes).to_parquet(str(path))
    return path


def load_episodes(output_dir: str | os.PathLike, pattern: str = "*.parquet"):
    """The episodes a trainer saved under `output_dir/episodes/` (files matching `pattern`, e.g. "train-step-3*"),
    in file-name order, as one `datasets.Dataset`."""
    import datasets

    files = sorted((Path(output_dir) / EPISODES_DIR).glob(pattern))
    if not files:
        raise FileNotFoundError(f"no saved episodes match {pattern!r} in {Path(output_dir) / EPISODES_DIR}: train "
                                "with save_episodes=True")
    return datasets.concatenate_datasets([datasets.Dataset.from_parquet(str(f)) for f in files])
