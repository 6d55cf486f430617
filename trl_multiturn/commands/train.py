"""The train-and-evaluate driver of the examples and `trl-multiturn train`: the trainer table, the held-out
evaluation that ends a run, resuming, and the run's end (save, evaluate, push, end the process group)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import trl_multiturn

from ..evaluation import evaluate
from ..model_card import START_EVAL_RESULTS_FILE
from ..model_setup import model_setup_kwargs
from ..rollout.rules import EpisodeRules
from ..statistics import paired_test
from .script_args import TextWorldScriptArguments, task_noun

TRAINERS = {
    "grpo": ("MultiTurnGRPOTrainer", "MultiTurnGRPOConfig"),
    "rloo": ("MultiTurnRLOOTrainer", "MultiTurnRLOOConfig"),
    "ppo": ("MultiTurnPPOTrainer", "MultiTurnPPOConfig"),
    "sft": ("MultiTurnSFTTrainer", "MultiTurnSFTConfig"),
    "dagger": ("MultiTurnDAggerTrainer", "MultiTurnDAggerConfig"),
}
"""Every trainer by its algorithm's name: (trainer class, config class) in `trl_multiturn`'s public API."""
SUPERVISED_ALGORITHMS = ("sft", "dagger")
RL_ALGORITHMS = tuple(name for name in TRAINERS if name not in SUPERVISED_ALGORITHMS)


def trainer_class(algorithm: str) -> type:
    return getattr(trl_multiturn, TRAINERS[algorithm][0])


def config_class(algorithm: str) -> type:
    return getattr(trl_multiturn, TRAINERS[algorithm][1])


def evaluate_on_tasks(script_args: TextWorldScriptArguments, held_out, environment_factory, model, tokenizer,
                      training_args, trainer=None, label: str = "", env: str = "textworld"):
    """Success on the held-out tasks `held_out()` of environment `env` at `eval_temperature` (greedy by default),
    printed (after `label`) and returned; with a `trainer`, also kept by `trainer.record_evaluation`
    (eval_results.json, `report_to`, model card)."""
    options = evaluation_options(training_args, script_args.eval_max_turns)
    tasks = held_out()
    result = evaluate(model, environment_factory, tasks, tokenizer, temperature=script_args.eval_temperature,
                      **options)
    how = "greedy" if script_args.eval_temperature == 0 else f"temperature-{script_args.eval_temperature:g}"
    print(f"{label}held-out {how} evaluation on {len(tasks)} {task_noun(env)}: {result}")
    if trainer is not None:
        trainer.record_evaluation(result, split="test")
    return result


def textworld_held_out(script_args: TextWorldScriptArguments, training_args) -> functools.partial:
    """The held-out games of a TextWorld run, made when called: `num_eval_games` of the test split."""
    return functools.partial(script_args.tasks, "test", script_args.num_eval_games,
                             not getattr(training_args, "disable_tqdm", False))


def evaluate_on_textworld(script_args: TextWorldScriptArguments, model, tokenizer, training_args, trainer=None,
                          label: str = ""):
    """`evaluate_on_tasks` on TextWorld's held-out games (`textworld_held_out`)."""
    return evaluate_on_tasks(script_args, textworld_held_out(script_args, training_args),
                             script_args.environment_factory(), model, tokenizer, training_args, trainer, label)


def side_by_side(before, after, start: str, trainer_name: str) -> str:
    """The held-out results of the starting model and of the trained one, with the paired test between them."""
    width = max(len(start), len(trainer_name) + 8)
    return "\n".join([
        "held-out success, the same games:",
        f"  {start:<{width}}  {before}",
        f"  {'+ ' + trainer_name:<{width}}  {after}",
        f"  trained vs start: {paired_test(after.won_by_task(), before.won_by_task())}",
    ])


def evaluation_options(training_args, max_turns: int | None = None) -> dict:
    """`evaluate` keyword arguments that play held-out episodes by the rules the trainer's rollouts were played by
    (`EpisodeRules.from_config`, the rules the trainer saves with the model; `max_turns` overrides the config's). A
    config's `disable_tqdm` turns the progress bar off."""
    rules = EpisodeRules.from_config(training_args)
    return dict(rules=dataclasses.replace(rules, max_turns=max_turns) if max_turns else rules,
                progress=not getattr(training_args, "disable_tqdm", False))


RESUME_LATEST = ("true", "latest")
"""`--resume_from_checkpoint` values that mean the latest `checkpoint-N` in `output_dir`."""


def checkpoint_to_resume(training_args) -> str | bool | None:
    """What `trainer.train(resume_from_checkpoint=...)` gets from `training_args.resume_from_checkpoint`: None (start
    afresh), True for "true" or "latest" (the latest checkpoint-N in output_dir), or the checkpoint folder, which
    must exist. Refused with the field and the fix when it names nothing to resume from."""
    value = getattr(training_args, "resume_from_checkpoint", None)
    if value in (None, "", False):
        return None
    if value is True or str(value).lower() in RESUME_LATEST:
        if not any(Path(training_args.output_dir).glob("checkpoint-*")):
            raise ValueError(f"resume_from_checkpoint={value!r}: output_dir={training_args.output_dir!r} holds no "
                             "checkpoint-N folder; start without it, or point output_dir at the interrupted run")
        return True
    if not Path(value, "trainer_state.json").is_file():
        raise ValueError(f"resume_from_checkpoint={value!r} is not a checkpoint folder (no trainer_state.json); give "
                         "a checkpoint-N folder of the interrupted run, or 'latest'")
    return str(value)


def train_and_evaluate(trainer, training_args, evaluate_held_out, start: str, eval_start_model: bool = False) -> None:
    """Train, then finish the run (`finish_run`) with the held-out evaluation `evaluate_held_out(model, tokenizer,
    trainer=None, label="")` when one is given. With `eval_start_model`, the starting model plays the same held-out
    games before training, and both results are printed side by side (`side_by_side`, `start` naming the start);
    the start's per-task outcomes go to `START_EVAL_RESULTS_FILE` beside the trained model's `eval_results.json`, so
    that the paired test can be recomputed from the files."""
    before = None
    if evaluate_held_out is not None and eval_start_model:
        before = evaluate_held_out(trainer.model, trainer.processing_class, label="starting model, ")
        if trainer.args.should_save:
            before.save(training_args.output_dir, START_EVAL_RESULTS_FILE, model=start)
    trainer.train(resume_from_checkpoint=checkpoint_to_resume(training_args))

    def held_out():
        after = evaluate_held_out(trainer.model, trainer.processing_class, trainer=trainer)
        if before is not None:
            print(side_by_side(before, after, start, type(trainer).__name__))

    finish_run(trainer, training_args, held_out if evaluate_held_out is not None else None)


def finish_run(trainer, training_args, held_out=None, **push_kwargs) -> None:
    """What every example does after `trainer.train()`: save the model, call `held_out()` (a greedy evaluation) if
    given, push to the Hub if asked (with `push_kwargs`), and end the run: the distributed process group is
    destroyed before exit-time destructors run, so the trainer is no longer usable across ranks."""
    trainer.save_model(training_args.output_dir)
    if trainer.is_world_process_zero():
        print(f"{type(trainer).__name__}: saved the model, its episode settings and card in "
              f"{training_args.output_dir}")
    if held_out is not None:
        held_out()
    if training_args.push_to_hub:
        trainer.push_to_hub(**push_kwargs)
    trainer.accelerator.end_training()


def train_on_tasks(trainer_cls, script_args: TextWorldScriptArguments, training_args, model_args, environment_factory,
                   train_dataset, held_out, env: str = "textworld", **trainer_kwargs):
    """Train `trainer_cls` on `train_dataset` with `environment_factory`, save, evaluate greedily on the held-out
    tasks `held_out()` of environment `env` (unless `num_eval_games` is 0), push to the Hub if asked, and end the run
    (`finish_run`). `model_args` (a `ModelSetup`: dtype, LoRA, 4/8-bit) is passed on as TRL's scripts do. Returns
    the trainer."""
    trainer_kwargs = {**model_setup_kwargs(model_args, training_args), **trainer_kwargs}
    trainer = trainer_cls(model=script_args.model_path, args=training_args, environment_factory=environment_factory,
                          train_dataset=train_dataset, **trainer_kwargs)
    evaluate_held_out = None
    if script_args.num_eval_games != 0:
        evaluate_held_out = functools.partial(evaluate_on_tasks, script_args, held_out, environment_factory,
                                              training_args=training_args, env=env)
    train_and_evaluate(trainer, training_args, evaluate_held_out, script_args.model_name_or_path,
                       script_args.eval_start_model)
    return trainer


def train_on_textworld(trainer_cls, script_args: TextWorldScriptArguments, training_args, model_args=None,
                       environment_factory=None, **trainer_kwargs):
    """What every TextWorld example does: `train_on_tasks` on the train split's games (from `first_train_game`)
    and the test split's held out, with `environment_factory` (default: `script_args.environment_factory()`).
    Returns the trainer."""
    train_dataset = script_args.tasks("train", script_args.num_train_games, not training_args.disable_tqdm)
    return train_on_tasks(trainer_cls, script_args, training_args, model_args,
                          environment_factory or script_args.environment_factory(), train_dataset,
                          textworld_held_out(script_args, training_args), **trainer_kwargs)
