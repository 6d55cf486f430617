"""Multi-turn GRPO on SWE-Gym: the model resolves issues in real repositories with shell commands and file edits,
and each episode's reward is SWE-bench's grading of its diff (FAIL_TO_PASS tests fixed, PASS_TO_PASS kept).

    # The 12 offline tasks shipped with trl-multiturn, in local sandboxes (no Docker, no network):
    accelerate launch examples/swegym_grpo.py --config recipes/swegym_grpo.yaml

    # SWE-Gym itself, on a host whose Docker engine can pull the xingyaoww/sweb.eval.x86_64.* images:
    accelerate launch examples/swegym_grpo.py --config recipes/swegym_grpo.yaml \
        --dataset_name SWE-Gym/SWE-Gym --sandbox docker

Every field of `ScriptArguments`, `MultiTurnGRPOConfig` and `SWEGymConfig` can be set in the YAML or on the
command line.
"""

import functools
from dataclasses import dataclass, field

from datasets import load_dataset

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.commands.parsing import CommandParser
from trl_multiturn.commands.train import checkpoint_to_resume, finish_run
from trl_multiturn.envs.swegym import SWEGymConfig, SWEGymEnv, load_tasks
from trl_multiturn.model_setup import ModelSetup, model_setup_kwargs


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(
        default="Qwen/Qwen2.5-Coder-1.5B-Instruct", metadata={"help": "Model id on the Hub or a local path."}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "SWE-bench-schema task rows (Hub id such as SWE-Gym/SWE-Gym, or a local path); "
                  "None trains on the offline tasks shipped with trl-multiturn."},
    )
    dataset_split: str = field(default="train", metadata={"help": "Split of `dataset_name`."})
    tasks: list[str] | None = field(
        default=None, metadata={"help": "Names of shipped tasks to train on (default: all of them)."}
    )


def main(script_args: ScriptArguments, training_args: MultiTurnGRPOConfig, env_args: SWEGymConfig,
         model_args: ModelSetup) -> None:
    if script_args.dataset_name:
        dataset = load_dataset(script_args.dataset_name, split=script_args.dataset_split)
    else:
        dataset = load_tasks(script_args.tasks)
    trainer = MultiTurnGRPOTrainer(
        model=script_args.model_name_or_path,
        args=training_args,
        environment_factory=functools.partial(SWEGymEnv, env_args),
        train_dataset=dataset,
        **model_setup_kwargs(model_args, training_args),
    )
    trainer.train(resume_from_checkpoint=checkpoint_to_resume(training_args))
    finish_run(trainer, training_args, dataset_name=script_args.dataset_name or "trl-multiturn/swegym-offline")


if __name__ == "__main__":
    parser = CommandParser((ScriptArguments, MultiTurnGRPOConfig, SWEGymConfig, ModelSetup))
    main(*parser.parse_args_and_config())
