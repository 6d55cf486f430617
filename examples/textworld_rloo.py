"""Multi-turn RLOO on TextWorld: each game is played `num_generations` times and every episode's return is
compared with the mean return of the other episodes of the same game (leave-one-out).

    # The paper's w2-o3-q4 games (generated here, offline), the offline default model:
    accelerate launch examples/textworld_rloo.py --config recipes/textworld_rloo.yaml

    # Any Hub model, or a checkpoint of examples/textworld_sft.py as the starting point:
    accelerate launch examples/textworld_rloo.py --config recipes/textworld_rloo.yaml \
        --model_name_or_path outputs/textworld_sft

Games are generated on first use from the train split's seeds and cached; the run ends with greedy success on
held-out games from the test split. Every field of `TextWorldScriptArguments` and `MultiTurnRLOOConfig` can be set
in the YAML or on the command line.
"""

from trl import TrlParser

from trl_multiturn import MultiTurnRLOOConfig, MultiTurnRLOOTrainer
from trl_multiturn.commands.script_args import TextWorldScriptArguments
from trl_multiturn.commands.train import train_on_textworld
from trl_multiturn.model_setup import ModelSetup


def main(script_args: TextWorldScriptArguments, training_args: MultiTurnRLOOConfig, model_args: ModelSetup) -> None:
    train_on_textworld(MultiTurnRLOOTrainer, script_args, training_args, model_args)


if __name__ == "__main__":
    parser = TrlParser((TextWorldScriptArguments, MultiTurnRLOOConfig, ModelSetup))
    main(*parser.parse_args_and_config())
