"""Multi-turn GRPO on TextWorld: the model plays generated text games turn by turn and learns from winning.

    # The paper's w2-o3-q4 games (generated here, offline), the offline default model:
    accelerate launch examples/textworld_grpo.py --config recipes/textworld_w2-o3-q4_grpo.yaml

    # Any Hub model and other games:
    accelerate launch examples/textworld_grpo.py --config recipes/textworld_w2-o3-q4_grpo.yaml \
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --world_size 4 --nb_objects 6 --quest_length 8

Games are generated on first use from the train split's seeds and cached; the run ends with greedy success on
held-out games from the test split. Every field of `TextWorldScriptArguments` and `MultiTurnGRPOConfig` can be set
in the YAML or on the command line.
"""

import functools

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.commands.parsing import CommandParser
from trl_multiturn.commands.script_args import TextWorldScriptArguments
from trl_multiturn.commands.train import evaluate_on_textworld, train_and_evaluate
from trl_multiturn.model_setup import ModelSetup, model_setup_kwargs


def main(script_args: TextWorldScriptArguments, training_args: MultiTurnGRPOConfig, model_args: ModelSetup) -> None:
    # The environment and the training games (generated on first use from the train split's seeds, then cached).
    environment_factory = script_args.environment_factory()
    train_dataset = script_args.tasks("train", script_args.num_train_games, not training_args.disable_tqdm)

    # The trainer loads the model from its path with ModelSetup's dtype, LoRA and 4/8-bit settings.
    trainer = MultiTurnGRPOTrainer(
        model=script_args.model_path,
        args=training_args,
        environment_factory=environment_factory,
        train_dataset=train_dataset,
        **model_setup_kwargs(model_args, training_args),
    )

    # Train (resuming with --resume_from_checkpoint), save, play the held-out test-split games (with
    # --eval_start_model, also before training, side by side), push to the Hub if asked.
    evaluate_held_out = functools.partial(evaluate_on_textworld, script_args, training_args=training_args)
    train_and_evaluate(trainer, training_args, evaluate_held_out if script_args.num_eval_games else None,
                       script_args.model_name_or_path, script_args.eval_start_model)


if __name__ == "__main__":
    parser = CommandParser((TextWorldScriptArguments, MultiTurnGRPOConfig, ModelSetup))
    main(*parser.parse_args_and_config())
