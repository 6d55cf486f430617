"""The script arguments of the TextWorld examples and of `trl-multiturn train`/`eval`, parsed by `TrlParser`, and
`train_on_textworld`, what every TextWorld example does. Importing this module does not import TextWorld."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ...config_checks import Range
from ...script_args import ModelArguments, evaluation_options, train_and_evaluate


@dataclass
class TextWorldScriptArguments(ModelArguments):
    """Which model, which games, and the held-out evaluation that ends every TextWorld example."""

    world_size: int | None = field(default=2, metadata={"help": "Rooms per game (the paper's custom games)."})
    nb_objects: int | None = field(default=3, metadata={"help": "Objects per game."})
    quest_length: int | None = field(default=4, metadata={"help": "Length of the winning walkthrough."})
    challenge: str | None = field(
        default=None, metadata={"help": "A TextWorld challenge such as 'tw-simple' instead of custom games."}
    )
    challenge_rewards: str = field(default="dense", metadata={"help": "tw-simple rewards: dense, balanced, sparse."})
    challenge_goal: str = field(default="detailed", metadata={"help": "tw-simple goal: detailed, brief, none."})
    num_train_games: int | None = field(
        default=16,
        metadata={"help": "Training games (seeds of the train split). None only where evaluation reads a recipe "
                          "shared with ALFWorld's example (there: every game); TextWorld training needs a number."},
    )
    num_eval_games: int = field(default=10, metadata={"help": "Held-out games (seeds of the test split)."})
    games_dir: str | None = field(default=None, metadata={"help": "Game cache folder (default: TextWorldEnv's)."})
    admissible_commands: bool = field(
        default=False, metadata={"help": "List the valid commands in every observation (the paper plays without)."}
    )
    eval_max_turns: int | None = field(
        default=None, metadata={"help": "Turns per held-out episode (default: the trainer's max_turns)."}
    )
    eval_start_model: bool = field(
        default=False,
        metadata={"help": "Also play the held-out games with the starting model, before training, and print both "
                          "results side by side at the end, with an exact McNemar test on the paired outcomes."},
    )
    eval_temperature: float = field(
        default=0.0,
        metadata={"help": "Sampling temperature of the held-out evaluation: 0 plays greedily (the default); the "
                          "paper validates at 0.4. Training rollouts keep the trainer's own `temperature`."},
    )
    first_train_game: int = field(
        default=0,
        metadata={"help": "Index of the first training game in the train split's seed range. Give an SFT recipe and "
                          "the RL recipe that starts from it disjoint ranges (e.g. SFT from 500000) so that SFT "
                          "demonstrations never come from the games RL plays."},
    )

    _RANGES = {
        "world_size": Range(ge=1), "nb_objects": Range(ge=0), "quest_length": Range(ge=1),
        "num_train_games": Range(ge=1), "num_eval_games": Range(ge=0), "eval_max_turns": Range(ge=1),
        "eval_temperature": Range(ge=0), "first_train_game": Range(ge=0),
    }

    def tasks(self, split: str, num_games: int, progress: bool = True):
        """The task `Dataset` of `num_games` games of `split`, generated on first use (with a progress bar; training
        games start at `first_train_game`)."""
        from .tasks import textworld_tasks

        first_game = self.first_train_game if split == "train" else 0
        where = dict(split=split, num_games=num_games, first_game=first_game, games_dir=self.games_dir,
                     progress=progress)
        if self.challenge:
            return textworld_tasks(challenge=self.challenge, rewards=self.challenge_rewards, goal=self.challenge_goal,
                                   **where)
        return textworld_tasks(self.world_size, self.nb_objects, self.quest_length, **where)

    def environment_factory(self):
        from .env import TextWorldEnv

        return functools.partial(TextWorldEnv, games_dir=self.games_dir,
                                 admissible_commands_in_observation=self.admissible_commands)

    def evaluate_held_out(self, model, tokenizer, training_args, trainer=None, label: str = ""):
        """Success on the held-out (test-split) games at `eval_temperature` (greedy by default), printed (after
        `label`) and returned; with a `trainer`, also kept by `trainer.record_evaluation` (eval_results.json,
        `report_to`, model card)."""
        from ...evaluation import evaluate

        options = evaluation_options(training_args, self.eval_max_turns)
        tasks = self.tasks("test", self.num_eval_games, options["progress"])
        result = evaluate(model, self.environment_factory(), tasks, tokenizer, temperature=self.eval_temperature,
                          **options)
        how = "greedy" if self.eval_temperature == 0 else f"temperature-{self.eval_temperature:g}"
        print(f"{label}held-out {how} evaluation on {self.num_eval_games} test games: {result}")
        if trainer is not None:
            trainer.record_evaluation(result, split="test")
        return result


def train_on_textworld(trainer_cls, script_args: TextWorldScriptArguments, training_args, model_args=None,
                       **trainer_kwargs):
    """What every TextWorld example does: train `trainer_cls` on the train split's games, save, evaluate greedily
    on held-out games (when `num_eval_games > 0`), push to the Hub if asked, and end the run (`finish_run`).
    `model_args` (a `ModelSetup`: dtype, LoRA, 4/8-bit) is passed on as TRL's scripts do. Returns the trainer."""
    from ...model_setup import model_setup_kwargs

    if script_args.num_train_games is None:
        raise ValueError("num_train_games=None: give the number of TextWorld training games (an integer >= 1)")
    trainer_kwargs = {**model_setup_kwargs(model_args, training_args), **trainer_kwargs}
    trainer = trainer_cls(
        model=script_args.model_path,
        args=training_args,
        environment_factory=script_args.environment_factory(),
        train_dataset=script_args.tasks("train", script_args.num_train_games, not training_args.disable_tqdm),
        **trainer_kwargs,
    )
    evaluate_held_out = None
    if script_args.num_eval_games > 0:
        evaluate_held_out = functools.partial(script_args.evaluate_held_out, training_args=training_args)
    train_and_evaluate(trainer, training_args, evaluate_held_out, script_args.model_name_or_path,
                       script_args.eval_start_model)
    return trainer
