"""DAgger on TextWorld from the games' own expert: the student plays, the expert labels every state it reaches.

    # The quickstart's w1-o2-q2 games, the offline default model (docs/study_learning_signal.md's DAgger arm):
    accelerate launch examples/textworld_dagger.py --config recipes/quickstart_dagger.yaml

Each iteration plays one episode per training game under DAgger's mixture policy (the expert acts at a turn with
probability beta_i = dagger_beta_0 * dagger_beta_decay**i, the model otherwise), labels every state reached with
TextWorld's expert action for it (`TextWorldEnv.expert_action`: its quest tracker's plan), and trains on all states
gathered so far: only the expert action's tokens, tokenized exactly as the RL rollouts tokenize them. The run ends
with greedy success on held-out games from the test split. Every field of `TextWorldScriptArguments` and
`MultiTurnDAggerConfig` can be set in the YAML or on the command line.
"""

import functools

from trl_multiturn import MultiTurnDAggerConfig, MultiTurnDAggerTrainer
from trl_multiturn.commands.parsing import CommandParser
from trl_multiturn.commands.script_args import TextWorldScriptArguments
from trl_multiturn.commands.train import evaluate_on_textworld, train_and_evaluate
from trl_multiturn.model_setup import ModelSetup, model_setup_kwargs


def main(script_args: TextWorldScriptArguments, training_args: MultiTurnDAggerConfig, model_args: ModelSetup) -> None:
    # The training games are task rows: the trainer plays them, asking the environment's expert at every state.
    trainer = MultiTurnDAggerTrainer(
        model=script_args.model_path,
        args=training_args,
        environment_factory=script_args.environment_factory(),
        train_dataset=script_args.tasks("train", script_args.num_train_games, not training_args.disable_tqdm),
        **model_setup_kwargs(model_args, training_args),
    )
    # `dagger_iterations` rounds of play, label, train; then save and play the held-out test-split games.
    evaluate_held_out = functools.partial(evaluate_on_textworld, script_args, training_args=training_args)
    train_and_evaluate(trainer, training_args, evaluate_held_out if script_args.num_eval_games else None,
                       script_args.model_name_or_path, script_args.eval_start_model)


if __name__ == "__main__":
    parser = CommandParser((TextWorldScriptArguments, MultiTurnDAggerConfig, ModelSetup))
    main(*parser.parse_args_and_config())
