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

from trl import TrlParser

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.commands.script_args import TextWorldScriptArguments
from trl_multiturn.commands.train import train_on_textworld
from trl_multiturn.model_setup import ModelSetup


def main(script_args: TextWorldScriptArguments, training_args: MultiTurnGRPOConfig, model_args: ModelSetup) -> None:
    train_on_textworld(MultiTurnGRPOTrainer, script_args, training_args, model_args)


if __name__ == "__main__":
    parser = TrlParser((TextWorldScriptArguments, MultiTurnGRPOConfig, ModelSetup))
    main(*parser.parse_args_and_config())
