"""Multi-turn PPO on TextWorld: a critic values every token the model samples, and GAE (gamma = lam = 1 by default,
as in the paper) turns the game's rewards into per-token advantages, skipping the game's observation tokens.

    # The paper's w2-o3-q4 games (generated here, offline), the offline default model:
    accelerate launch examples/textworld_ppo.py --config recipes/textworld_ppo.yaml

    # Any Hub model, or a checkpoint of examples/textworld_sft.py as the starting point (policy and critic):
    accelerate launch examples/textworld_ppo.py --config recipes/textworld_ppo.yaml \
        --model_name_or_path outputs/textworld_sft

The critic starts as a copy of the policy's backbone with a fresh scalar head (or from `--value_model`), and is
saved next to the policy in `critic/` of every checkpoint and of the output folder. Games are generated on first
use from the train split's seeds and cached; the run ends with greedy success on held-out games from the test split.
Every field of `TextWorldScriptArguments` and `MultiTurnPPOConfig` can be set in the YAML or on the command line.
"""

from trl import TrlParser

from trl_multiturn import MultiTurnPPOConfig, MultiTurnPPOTrainer
from trl_multiturn.commands.script_args import TextWorldScriptArguments
from trl_multiturn.commands.train import train_on_textworld
from trl_multiturn.model_setup import ModelSetup


def main(script_args: TextWorldScriptArguments, training_args: MultiTurnPPOConfig, model_args: ModelSetup) -> None:
    train_on_textworld(MultiTurnPPOTrainer, script_args, training_args, model_args)


if __name__ == "__main__":
    parser = TrlParser((TextWorldScriptArguments, MultiTurnPPOConfig, ModelSetup))
    main(*parser.parse_args_and_config())
