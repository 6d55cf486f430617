"""Multi-turn SFT on TextWorld walkthroughs: the warm start the paper gives its RL runs.

    # The paper's w2-o3-q4 games (generated here, offline), the offline default model:
    accelerate launch examples/textworld_sft.py --config recipes/textworld_sft.yaml

    # Then RL from the SFT checkpoint, in the very format SFT taught (same system prompt and action parser):
    accelerate launch examples/textworld_grpo.py --config recipes/textworld_w2-o3-q4_grpo.yaml \
        --model_name_or_path outputs/textworld_sft

Each training game's walkthrough is replayed through the real TextWorld engine and kept only if it wins; the model
is trained on every assistant turn of those episodes (each command and its end-of-turn token), tokenized exactly as
the RL rollouts tokenize them. The run ends with greedy success on held-out games from the test split. Every field
of `TextWorldScriptArguments` and `MultiTurnSFTConfig` can be set in the YAML or on the command line.
"""

from trl import TrlParser

from trl_multiturn import MultiTurnSFTConfig, MultiTurnSFTTrainer
from trl_multiturn.commands.script_args import TextWorldScriptArguments
from trl_multiturn.commands.train import train_on_textworld
from trl_multiturn.model_setup import ModelSetup


def main(script_args: TextWorldScriptArguments, training_args: MultiTurnSFTConfig, model_args: ModelSetup) -> None:
    # With `environment_factory`, the trainer turns the task rows into won expert episodes itself.
    train_on_textworld(MultiTurnSFTTrainer, script_args, training_args, model_args)


if __name__ == "__main__":
    parser = TrlParser((TextWorldScriptArguments, MultiTurnSFTConfig, ModelSetup))
    main(*parser.parse_args_and_config())
