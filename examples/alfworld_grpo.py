"""Multi-turn GRPO on ALFWorld: the model carries out household tasks ("heat some potato and put it in sinkbasin")
in ALFWorld's text engine, turn by turn, and learns from the episodes it wins.

    # Offline smoke run: games generated here, the offline default model (SmolLM2-135M), a few steps on CPU:
    accelerate launch examples/alfworld_grpo.py

    # The paper-scale run on ALFWorld's 3,553 training games (after `alfworld-download`), from an SFT warm start:
    accelerate launch examples/alfworld_grpo.py --config recipes/alfworld_grpo.yaml

Games come from `data_path` (or `$ALFWORLD_DATA` when `alfworld-download` has filled it); with neither, a small set
of the six task types is generated offline (`trl-multiturn make-games --env alfworld` does the same). Every field
of `ScriptArguments`, `MultiTurnGRPOConfig`, `ALFWorldConfig` and `ALFWorldGenConfig` can be set in the YAML or on
the command line.
"""

import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import TrlParser

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.envs.alfworld import TASK_TYPES, ALFWorldConfig, ALFWorldEnv
from trl_multiturn.envs.alfworld import alfworld_tasks as alfworld_task_rows
from trl_multiturn.envs.alfworld.generator import ALFWorldGenConfig
from trl_multiturn.evaluation import evaluate
from trl_multiturn.model_setup import ModelSetup, model_setup_kwargs
from trl_multiturn.script_args import ModelArguments, evaluation_options, finish_run

# Without `--config`, a run that fits a CPU in minutes; a YAML recipe or the command line overrides any of these.
SMOKE_DEFAULTS = dict(
    output_dir="outputs/alfworld_grpo",
    max_turns=4,
    max_completion_length=16,
    max_episode_tokens=2048,
    system_prompt="You are in a household. Reply with one action only, such as 'go to cabinet 1', 'open fridge 1', "
    "'take apple 1 from countertop 1', 'heat apple 1 with microwave 1' or 'move apple 1 to diningtable 1'.",
    num_generations=2,
    per_device_train_batch_size=2,
    learning_rate=1.0e-6,
    max_steps=3,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    bf16=False,
    use_cpu=not torch.cuda.is_available(),
)
GENERATED_GAMES = 12  # generated when no dataset is configured: two of each task type


@dataclass
class ScriptArguments(ModelArguments):
    warm_start_path: str | None = field(
        default=None,
        metadata={"help": "Checkpoint of an SFT warm start (MultiTurnSFTTrainer on ALFWorld expert episodes, "
                  "tokenizer saved with it); when set, GRPO starts from it instead of model_name_or_path."},
    )
    task_types: list[str] | None = field(
        default=None, metadata={"help": f"ALFRED task types to train on (default: all six, {TASK_TYPES})."}
    )
    eval_task_types: list[str] | None = field(
        default=None,
        metadata={"help": "ALFRED task types of the held-out evaluation (default: all six, whatever `task_types` "
                  "trained on: the paper's train-on-some, evaluate-on-all mixtures)."},
    )
    num_train_games: int | None = field(
        default=None,
        metadata={"help": f"Training games, drawn at random (None: the whole split; {GENERATED_GAMES} when games "
                  "are generated)."},
    )
    games_dir: str = field(
        default="outputs/alfworld_games",
        metadata={"help": "Where games are generated when no dataset is found; existing ones are reused."},
    )
    eval_split: str = field(
        default="valid_unseen",
        metadata={"help": "Held-out split for the greedy evaluation after training: valid_seen or valid_unseen "
                  "(generated valid_unseen games use ALFRED's held-out rooms)."},
    )
    num_eval_games: int = field(default=0, metadata={"help": "Held-out games to evaluate on (0: no evaluation)."})


def alfworld_tasks(script_args, env_args, gen_args, split: str, num_games: int | None, seed: int,
                   task_types: list[str] | None = None):
    """Task rows of `split` (of `task_types`, default the training types): from the configured or downloaded
    dataset, else from games generated here (`trl_multiturn.envs.alfworld.alfworld_tasks`)."""
    return alfworld_task_rows(split, num_games, task_types or script_args.task_types, data_path=env_args.data_path,
                              games_dir=script_args.games_dir, gen_config=gen_args, seed=seed,
                              generated_games=GENERATED_GAMES)


def main(script_args: ScriptArguments, training_args: MultiTurnGRPOConfig, env_args: ALFWorldConfig,
         gen_args: ALFWorldGenConfig, model_args: ModelSetup) -> None:
    model = script_args.warm_start_path or script_args.model_path
    if script_args.warm_start_path and not Path(script_args.warm_start_path, "config.json").is_file():
        raise FileNotFoundError(
            f"warm_start_path={script_args.warm_start_path!r} holds no checkpoint. Train the SFT warm start first "
            "(MultiTurnSFTTrainer with environment_factory=ALFWorldEnv on the same tasks) or drop warm_start_path."
        )
    environment_factory = functools.partial(ALFWorldEnv, env_args)
    train_tasks = alfworld_tasks(script_args, env_args, gen_args, "train", script_args.num_train_games,
                                 training_args.seed)
    trainer = MultiTurnGRPOTrainer(
        model=model, args=training_args, environment_factory=environment_factory, train_dataset=train_tasks,
        **model_setup_kwargs(model_args, training_args),
    )
    trainer.train()

    def held_out():
        eval_tasks = alfworld_tasks(script_args, env_args, gen_args, script_args.eval_split,
                                    script_args.num_eval_games, training_args.seed,
                                    script_args.eval_task_types or list(TASK_TYPES))
        result = evaluate(trainer.model, environment_factory, eval_tasks, trainer.processing_class,
                          **evaluation_options(training_args))
        print(f"greedy evaluation on {len(eval_tasks)} {script_args.eval_split} games: {result}")
        trainer.record_evaluation(result, split=script_args.eval_split)  # eval_results.json, report_to, model card

    finish_run(trainer, training_args, held_out if script_args.num_eval_games else None)


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, MultiTurnGRPOConfig, ALFWorldConfig, ALFWorldGenConfig, ModelSetup))
    parser.set_defaults_with_config(**SMOKE_DEFAULTS)
    main(*parser.parse_args_and_config())
