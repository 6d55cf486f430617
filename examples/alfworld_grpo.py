"""Multi-turn GRPO on ALFWorld: the model carries out household tasks ("put some remotecontrol on shelf") in
ALFWorld's text engine, turn by turn, and learns from the episodes it wins.

    # Offline demonstration, CPU, games generated here: SFT warm start, GRPO from it, held-out side by side:
    accelerate launch examples/alfworld_grpo.py

    # The paper-scale run on ALFWorld's 3,553 training games (after `alfworld-download`), from an SFT warm start:
    accelerate launch examples/alfworld_grpo.py --config recipes/alfworld_grpo.yaml

With no arguments, the run has three stages on small generated pick_and_place_simple rooms (four receptacles), with
the offline default model (SmolLM2-135M-Instruct), which untrained wins no game:
  1. SFT warm start (`MultiTurnSFTTrainer`) on the won expert episodes of `num_sft_games` training games, saved to
     `warm_start_path`;
  2. multi-turn GRPO from that checkpoint on `num_train_games` other training games, with `turn_gamma` 0.9, so a
     faster win is worth more and the sampled episodes of one game rank even when all of them win;
  3. greedy held-out evaluation on `num_eval_games` valid_unseen games (ALFRED's held-out rooms), played by the SFT
     start before GRPO and by the trained model after it, printed side by side with an exact McNemar test.
The SFT, RL and held-out games are disjoint (`game_sets` checks it). GRPO runs 32 steps of 2 games x 4 episodes at
temperature 0.7 and learning rate 3e-5, in bf16 autocast on a CPU with bf16 instructions. Measured on 2 cores
(docs/alfworld.md): about 20 minutes, 5.2 GB peak; the SFT start won 38 of the 100 held-out games and the GRPO
model 63 (+31/-6, exact McNemar p = 4e-5), the learning rate chosen after 2e-5 gave 46 (p = 0.27) on the same games.
The gain is this seed's, not the recipe's: `--seed 1` to `--seed 4` gave +5, 0, -40 (a collapse) and -7 points, and
the test across those seeds does not reject (p = 0.38). With `--beta 0.04` (a KL loss to the SFT start), five fresh
seeds on 200 fresh held-out games gained +20.5, -6.5, +10, -5 and +7.5 points: no collapse, no gain shown (p = 0.35).

Games come from `data_path` (or `$ALFWORLD_DATA` when `alfworld-download` has filled it); with neither, they are
generated offline (`trl-multiturn make-games --env alfworld` does the same). Every field of `ScriptArguments`,
`MultiTurnGRPOConfig`, `ALFWorldConfig`, `ALFWorldGenConfig` and `ModelSetup` can be set in the YAML or on the
command line; `--num_sft_games 0` skips the SFT stage (GRPO then starts from `warm_start_path` when it holds a
checkpoint, else from `model_name_or_path`).
"""

import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer, MultiTurnSFTConfig, MultiTurnSFTTrainer
from trl_multiturn.commands.parsing import CommandParser
from trl_multiturn.commands.script_args import StartComparisonArguments
from trl_multiturn.commands.train import checkpoint_to_resume, evaluation_options, train_and_evaluate
from trl_multiturn.envs.alfworld import TASK_TYPES, ALFWorldConfig, ALFWorldEnv
from trl_multiturn.envs.alfworld import alfworld_tasks as alfworld_task_rows
from trl_multiturn.envs.alfworld.generator import ALFWorldGenConfig
from trl_multiturn.evaluation import evaluate
from trl_multiturn.model_setup import ModelSetup, model_setup_kwargs


def cpu_has_native_bf16() -> bool:
    """A run without a GPU on a CPU with bf16 instructions (AVX512-BF16 or AMX), where bf16 autocast made a training
    step of SmolLM2-135M 2.4x faster than fp32 (2 cores, benchmarks/cpu_bf16.py); elsewhere bf16 is emulated,
    slower than fp32. `torch.cpu`'s checks are private: PyTorch has no public one."""
    return not torch.cuda.is_available() and (torch.cpu._is_avx512_bf16_supported() or
                                              torch.cpu._is_amx_tile_supported())


# Without `--config`, the three-stage demonstration sized for a CPU; a YAML recipe or the command line overrides any
# of these (a recipe must set the fields it does not want from here: recipes/alfworld_grpo.yaml does).
SMOKE_DEFAULTS = dict(
    output_dir="outputs/alfworld_grpo",
    warm_start_path="outputs/alfworld_sft",
    task_types=["pick_and_place_simple"],
    eval_task_types=["pick_and_place_simple"],
    num_sft_games=32,
    sft_epochs=2.0,
    sft_batch_size=2,
    num_train_games=64,
    num_eval_games=100,
    eval_start_model=True,
    num_receptacles=4,
    num_distractors=2,
    num_closed=1,
    max_turns=8,
    max_completion_length=16,
    max_episode_tokens=2048,
    system_prompt="You are in a household. Reply with one action only, such as 'go to cabinet 1', 'open fridge 1', "
    "'take apple 1 from countertop 1', 'heat apple 1 with microwave 1' or 'move apple 1 to diningtable 1'.",
    action_parser="first_line",
    reward_mode="sparse",
    turn_gamma=0.9,
    num_generations=4,
    per_device_train_batch_size=2,  # 8 episodes a step (2 games x 4) in micro-batches of 2 (one batch of 8: 9 GB)
    gradient_accumulation_steps=4,
    temperature=0.7,  # closer to the greedy policy evaluated than 1.0, and more groups hold a win to learn from
    learning_rate=3.0e-5,
    max_steps=32,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    bf16=cpu_has_native_bf16(),
    use_cpu=not torch.cuda.is_available(),
)
GENERATED_GAMES = 12  # generated when no dataset is configured and num_train_games is None: two of each task type


@dataclass
class ScriptArguments(StartComparisonArguments):
    warm_start_path: str | None = field(
        default=None,
        metadata={"help": "Checkpoint of the SFT warm start: written there by the SFT stage when num_sft_games > 0, "
                  "else read from there when it holds a checkpoint (MultiTurnSFTTrainer on ALFWorld expert "
                  "episodes, tokenizer saved with it); GRPO starts from it instead of model_name_or_path."},
    )
    num_sft_games: int = field(
        default=0,
        metadata={"help": "SFT stage first: train model_name_or_path on the won expert episodes of this many training "
                  "games (never the RL games) and save it to warm_start_path; 0: no SFT stage."},
    )
    sft_first_game: int = field(
        default=500_000,
        metadata={"help": "Generated games: index of the first SFT game in the train split's seeds, past the RL "
                  "games (0 .. num_train_games - 1). Downloaded games: the RL games are left out of the SFT set."},
    )
    sft_epochs: float = field(default=3.0, metadata={"help": "Epochs of the SFT stage."})
    sft_learning_rate: float = field(default=1.0e-4, metadata={"help": "Learning rate of the SFT stage."})
    sft_batch_size: int = field(default=4, metadata={"help": "Episodes per SFT step (per device)."})
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
    eval_first_game: int = field(
        default=0,
        metadata={"help": "Generated games: index of the first held-out game in the test split's seeds. 0: the "
                  "ALFWorld suite's held-out games, which `trl-multiturn eval` plays; another value gives held-out "
                  "games no earlier run was judged on, e.g. to confirm a setting chosen on the first ones. "
                  "Downloaded games: unused (the split is fixed)."},
    )


def alfworld_tasks(script_args, env_args, gen_args, split: str, num_games: int | None, seed: int,
                   task_types: list[str] | None = None, first_game: int = 0):
    """Task rows of `split` (of `task_types`, default the training types): from the configured or downloaded
    dataset, else from games generated here (`trl_multiturn.envs.alfworld.alfworld_tasks`)."""
    return alfworld_task_rows(split, num_games, task_types or script_args.task_types, data_path=env_args.data_path,
                              games_dir=script_args.games_dir, gen_config=gen_args, seed=seed,
                              generated_games=GENERATED_GAMES, first_game=first_game)


def game_sets(script_args, env_args, gen_args, seed: int) -> dict:
    """The task rows of each stage, `{"sft": ..., "train": ..., "eval": ...}` ("sft" only with num_sft_games > 0,
    "eval" only with num_eval_games > 0), no game in two of them: generated SFT games start at sft_first_game;
    from a downloaded split, the RL games are left out of the SFT set."""
    sets = {"train": alfworld_tasks(script_args, env_args, gen_args, "train", script_args.num_train_games, seed)}
    if script_args.num_sft_games:
        rl_games = set(sets["train"]["game_file"])
        sft = alfworld_tasks(script_args, env_args, gen_args, "train", script_args.num_sft_games, seed,
                             first_game=script_args.sft_first_game)
        sets["sft"] = sft.filter(lambda row: row["game_file"] not in rl_games)
    if script_args.num_eval_games:
        # Seed 0: the ALFWorld suite's held-out rule (trl_multiturn.envs.suites), so that `trl-multiturn eval` and a
        # study play the same held-out games as this run.
        sets["eval"] = alfworld_tasks(script_args, env_args, gen_args, script_args.eval_split,
                                      script_args.num_eval_games, 0, script_args.eval_task_types or list(TASK_TYPES),
                                      first_game=script_args.eval_first_game)
    names = sorted(sets)
    for k, first in enumerate(names):
        for second in names[k + 1:]:
            shared = set(sets[first]["game_file"]) & set(sets[second]["game_file"])
            if shared:
                raise ValueError(f"the {first} and {second} games share {len(shared)} game(s), e.g. {min(shared)}: "
                                 "give the SFT games another sft_first_game")
    return sets


def sft_warm_start(script_args, training_args, environment_factory, tasks, model_args) -> str:
    """Stage 1: `MultiTurnSFTTrainer` on the won expert episodes of `tasks`, with the GRPO run's episode format
    (system prompt, action parser, chat template settings), saved to `warm_start_path`, which it returns."""
    if not script_args.warm_start_path:
        raise ValueError(f"num_sft_games={script_args.num_sft_games} needs warm_start_path, the folder the SFT "
                         "checkpoint is saved to (e.g. --warm_start_path outputs/alfworld_sft)")
    shared = ("system_prompt", "action_parser", "chat_template_kwargs", "use_training_chat_template", "bf16",
              "use_cpu", "report_to", "seed", "disable_tqdm", "logging_steps")
    args = MultiTurnSFTConfig(
        output_dir=script_args.warm_start_path, num_train_epochs=script_args.sft_epochs,
        learning_rate=script_args.sft_learning_rate, per_device_train_batch_size=script_args.sft_batch_size,
        lr_scheduler_type="linear", warmup_steps=2, save_strategy="no",
        **{name: getattr(training_args, name) for name in shared},
    )
    trainer = MultiTurnSFTTrainer(model=script_args.model_path, args=args, environment_factory=environment_factory,
                                  train_dataset=tasks, **model_setup_kwargs(model_args, args))
    trainer.train()
    trainer.save_model(args.output_dir)
    return args.output_dir


def main(script_args: ScriptArguments, training_args: MultiTurnGRPOConfig, env_args: ALFWorldConfig,
         gen_args: ALFWorldGenConfig, model_args: ModelSetup) -> dict:
    """The run's stages; returns the task rows of each (`game_sets`)."""
    environment_factory = functools.partial(ALFWorldEnv, env_args)
    games = game_sets(script_args, env_args, gen_args, training_args.seed)
    model, start = script_args.model_path, script_args.model_name_or_path
    # Resuming the GRPO stage: its warm start is already saved, and training it again would change nothing it uses.
    sft_done = bool(checkpoint_to_resume(training_args) and script_args.warm_start_path
                    and Path(script_args.warm_start_path, "config.json").is_file())
    if script_args.num_sft_games and not sft_done:
        model = start = sft_warm_start(script_args, training_args, environment_factory, games["sft"], model_args)
    elif script_args.warm_start_path:
        if not Path(script_args.warm_start_path, "config.json").is_file():
            raise FileNotFoundError(
                f"warm_start_path={script_args.warm_start_path!r} holds no checkpoint. Make the SFT warm start first "
                "(--num_sft_games N trains it on N games' expert episodes and saves it there) or drop "
                "warm_start_path."
            )
        model = start = script_args.warm_start_path
    trainer = MultiTurnGRPOTrainer(
        model=model, args=training_args, environment_factory=environment_factory, train_dataset=games["train"],
        **model_setup_kwargs(model_args, training_args),
    )

    def evaluate_held_out(model, tokenizer, trainer=None, label=""):
        result = evaluate(model, environment_factory, games["eval"], tokenizer, **evaluation_options(training_args))
        print(f"{label}greedy evaluation on {len(games['eval'])} {script_args.eval_split} games: {result}")
        if trainer is not None:
            trainer.record_evaluation(result, split=script_args.eval_split)  # eval_results.json, report_to, card
        return result

    train_and_evaluate(trainer, training_args, evaluate_held_out if "eval" in games else None, start,
                       script_args.eval_start_model)
    return games


if __name__ == "__main__":
    parser = CommandParser((ScriptArguments, MultiTurnGRPOConfig, ALFWorldConfig, ALFWorldGenConfig, ModelSetup))
    parser.set_defaults_with_config(**SMOKE_DEFAULTS)
    main(*parser.parse_args_and_config())
