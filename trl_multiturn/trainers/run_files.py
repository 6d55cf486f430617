"""What every trl-multiturn trainer writes beside a saved model, besides TRL's own files.

- `episode_settings.json` (every `save_model` and checkpoint): how episodes were played, for `trl-multiturn eval`;
- `trainer_state.json` (every `save_model`): the logged history, also when no checkpoint is kept, for
  `trl-multiturn plot`;
- `README.md`: trl-multiturn's model card instead of TRL's generic one (`create_model_card`, which TRL calls on every
  checkpoint and `push_to_hub` before uploading);
- `eval_results.json` (`record_evaluation`): a held-out evaluation, also logged through `report_to` and put in the
  card (beside it, `trl-multiturn eval` keeps each later evaluation in its own `eval_results_<key>.json`).

On the console, each log is one short line (`console.use_console_lines`) rather than the whole metrics dict.
"""

from __future__ import annotations

import os
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME

from ..episode_settings import episode_settings, save_episode_settings, task_distribution
from ..evaluation import load_eval_results
from ..model_card import base_model_name, build_model_card, recipe_from_argv
from .console import use_console_lines


class RunFilesMixin:
    """Mixed into a TRL trainer before the TRL class."""

    def __init__(self, *args, **kwargs):
        # The task rows as given: the SFT parent replaces its train_dataset with tokenized episodes.
        self._training_tasks = task_distribution(kwargs.get("train_dataset"))
        super().__init__(*args, **kwargs)
        use_console_lines(self)

    def episode_settings(self) -> dict:
        return episode_settings(self.args, getattr(self, "environment_factory", None),
                                getattr(self, "_training_tasks", None))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """TRL's `save_model`, plus `episode_settings.json` and `trainer_state.json`; a save the user asks for (not
        a checkpoint's or `push_to_hub`'s, which write the card themselves) also writes the model card."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            output_dir = output_dir or self.args.output_dir
            save_episode_settings(output_dir, self.episode_settings())
            self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))
            if not _internal_call:
                self._write_model_card(output_dir)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, **kwargs) -> None:
        """Write trl-multiturn's model card to `output_dir/README.md` (see `trl_multiturn.model_card`). Extra
        keyword arguments of `push_to_hub` (`finetuned_from`, ...) are accepted and ignored, as TRL does."""
        self._write_model_card(self.args.output_dir, model_name, dataset_name, tags)

    def _write_model_card(self, folder: str, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None) -> None:
        if not self.is_world_process_zero():
            return
        name_or_path = getattr(self.model, "name_or_path", None) or None
        card = build_model_card(
            model_name=model_name or Path(folder).name,
            trainer_name=type(self).__name__,
            base_model=base_model_name(name_or_path),
            local_base=name_or_path,
            args=self.args,
            settings=self.episode_settings(),
            global_step=self.state.global_step,
            recipe=recipe_from_argv(),
            eval_results=load_eval_results(folder),
            hub_model_id=self.hub_model_id,
            dataset_name=dataset_name,
            tags=[tags] if isinstance(tags, str) else tags,
            folder=str(folder),
        )
        os.makedirs(folder, exist_ok=True)
        card.save(os.path.join(folder, "README.md"))

    def record_evaluation(self, result, prefix: str = "heldout", **extra) -> None:
        """Keep a held-out `EvalResult`: write it to `output_dir/eval_results.json` (with `extra`, e.g. the split),
        log its summary through `report_to` as `<prefix>/success_rate`, `<prefix>/ci_low`, ... (and in
        `state.log_history`), and rewrite the model card with its table."""
        summary = result.summary()
        logs = {f"{prefix}/{key}": float(value) for key, value in summary.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool)}
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)
        if self.args.should_save:
            result.save(self.args.output_dir, **extra)
            self.create_model_card()
