"""`MultiTurnSFTTrainer`: TRL's `SFTTrainer` on whole multi-turn episodes, every assistant turn supervised."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import datasets
from trl import SFTConfig, SFTTrainer
from trl.data_utils import get_dataset_column_names

from ..config_checks import check_fields
from ..expert import conversation_token_ids, expert_trajectories
from ..rollout.chat_tokens import ChatTokenBuilder
from ..rollout.generation import generation_eos_ids, reply_eos_ids
from ..rollout.rules import EpisodeRules, rule_fields
from ..rollout.training_template import prepare_chat_template, use_training_chat_template_field
from .multiturn import bf16_only_where_supported, trainer_prologue
from .run_files import RunFilesMixin

logger = logging.getLogger(__name__)

SFT_RULES = ("system_prompt", "action_parser", "chat_template_kwargs")
"""The rules of play (`EpisodeRules`) an expert episode is written by, so SFT teaches the format RL plays."""


@dataclass
@rule_fields(names=SFT_RULES)
class MultiTurnSFTConfig(SFTConfig):
    """`SFTConfig` plus the fields that must match the RL trainers' so that SFT teaches the rollout format.

    The loss always covers exactly the assistant turns (each reply's tokens and its end-of-turn token), so
    `assistant_only_loss` and `completion_only_loss` do not apply. Each field's help says more
    (`trl-multiturn train sft --help`); TRL's `SFTConfig` documents the rest.

    Parameters:
        > Parameters that control the episode (rules of play, `EpisodeRules`: give them the RL recipe's values)

        system_prompt (`str`, *optional*):
            System message placed before the first observation of each expert episode.
        action_parser (`str`, defaults to `"first_line"`):
            The RL trainers' action parser: each expert action must read back unchanged through it, so that an RL
            rollout plays the action SFT taught.
        chat_template_kwargs (`dict`, *optional*):
            Extra keyword arguments for `apply_chat_template`, as in the RL configs.

        > Parameters that control the expert episodes

        skip_failed_experts (`bool`, defaults to `False`):
            Leave out tasks whose expert solution does not win instead of raising.

        > Parameters that control the chat template

        use_training_chat_template (`bool`, defaults to `True`):
            Switch to TRL's training version of a chat template that rewrites earlier turns (e.g. Qwen3's); False:
            refuse such templates.
    """

    # Parameters that control the episode: `system_prompt`, `action_parser`, `chat_template_kwargs` (`rule_fields`)

    # Parameters that control the expert episodes
    skip_failed_experts: bool = field(
        default=False,
        metadata={"help": "When building expert episodes from task rows: leave out tasks whose expert solution does "
                          "not win (logged) instead of raising."},
    )

    # Parameters that control the chat template
    use_training_chat_template: bool = use_training_chat_template_field()

    def __post_init__(self):
        check_fields(self)  # before TRL's own checks
        self.chat_template_kwargs = EpisodeRules.from_config(self).chat_template_kwargs  # checks the rules, as RL's
        bf16_only_where_supported(self)
        super().__post_init__()
        if self.assistant_only_loss:
            raise ValueError("assistant_only_loss=True: MultiTurnSFTTrainer always trains on the assistant turns only "
                             "(masks built token by token with the rollout's token builder). Leave it False.")


class MultiTurnSFTTrainer(RunFilesMixin, SFTTrainer):
    """SFT on multi-turn episodes, tokenized exactly as the RL rollouts tokenize them.

    Same arguments as `trl.SFTTrainer`, plus `environment_factory`. Each `train_dataset` / `eval_dataset` row is one
    of:

    * a task row (what the RL trainers take): with `environment_factory`, the trainer replays the task's expert
      solution through `expert_trajectories` and trains on the won episode;
    * an episode conversation in `messages` ([system,] user, assistant, user, ..., assistant): tokenized turn by turn
      with the rollout's `ChatTokenBuilder` and this trainer's tokenizer;
    * a pre-tokenized episode with `input_ids` and `assistant_masks` (e.g. `expert_trajectories(..., tokenizer=)`),
      used as is.

    The loss covers every assistant turn, each with its end-of-turn token, and nothing else. A checkpoint it saves
    is a plain causal LM with its tokenizer: pass its path as `model` to any multi-turn RL trainer.
    """

    _tag_names = ["trl", "sft", "trl-multiturn"]

    def __init__(
        self,
        model,
        args: MultiTurnSFTConfig | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_loss_func=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        optimizer_cls_and_kwargs=None,
        preprocess_logits_for_metrics=None,
        quantization_config=None,
        peft_config=None,
        environment_factory=None,
    ):
        model, args = trainer_prologue(type(self), MultiTurnSFTConfig, model, args)
        # Set before the parent's __init__, which prepares the datasets through `_prepare_dataset`.
        self.environment_factory = environment_factory
        self._generation_eos_ids = generation_eos_ids(model)
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            compute_loss_func=compute_loss_func,
            compute_metrics=compute_metrics,
            callbacks=callbacks,
            optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
            quantization_config=quantization_config,
            peft_config=peft_config,
        )

    def episode_token_builder(self, tokenizer, args: MultiTurnSFTConfig | None = None) -> ChatTokenBuilder:
        """The token builder an RL trainer builds for this tokenizer and config (same eos ids, same template
        arguments)."""
        args = args if args is not None else self.args
        eos = reply_eos_ids(tokenizer, self._generation_eos_ids)
        prepare_chat_template(tokenizer, None, args.use_training_chat_template, eos, args.chat_template_kwargs)
        return ChatTokenBuilder(tokenizer, eos, args.chat_template_kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
        if formatting_func is not None:
            raise ValueError("MultiTurnSFTTrainer tokenizes episodes with the rollout's token builder; a "
                             "formatting_func would change that format. Pass episodes as `messages` instead.")
        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        dataset = self._episode_dataset(dataset, tokenizer, args, dataset_name)
        return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)

    def _episode_dataset(self, dataset, tokenizer, args, dataset_name: str) -> datasets.Dataset:
        columns = get_dataset_column_names(dataset)
        if "input_ids" in columns:
            if "assistant_masks" not in columns and "labels" not in columns:
                raise ValueError(
                    f"The {dataset_name} dataset has `input_ids` but neither `assistant_masks` nor `labels`, so every "
                    "token (observations included) would be trained on. Build it with "
                    "`expert_trajectories(..., tokenizer=)`, or pass `messages` and let the trainer tokenize them."
                )
            return dataset
        builder = self.episode_token_builder(tokenizer, args)
        if "messages" in columns:
            rows = []
            for k, row in enumerate(dataset):
                try:
                    input_ids, mask = conversation_token_ids(builder, row["messages"])
                except ValueError as exc:
                    raise ValueError(f"{dataset_name} dataset, row {k}: {exc}") from None
                rows.append({**row, "input_ids": input_ids, "assistant_masks": mask})
            episodes = datasets.Dataset.from_list(rows)
        elif self.environment_factory is not None:
            episodes = expert_trajectories(
                self.environment_factory, dataset, tokenizer, system_prompt=args.system_prompt,
                action_parser=args.action_parser, eos_token_ids=builder.eos_token_ids,
                chat_template_kwargs=args.chat_template_kwargs, skip_failures=args.skip_failed_experts,
            )
        else:
            raise ValueError(
                f"The {dataset_name} dataset (columns {columns}) holds neither episodes (`messages`, or `input_ids` "
                "with `assistant_masks`) nor can its rows be replayed: pass `environment_factory` to build expert "
                "episodes from task rows, or build them with `trl_multiturn.expert.expert_trajectories`."
            )
        self._warn_long_episodes(episodes, args, dataset_name)
        return episodes

    @staticmethod
    def _warn_long_episodes(episodes: datasets.Dataset, args, dataset_name: str) -> None:
        limit = args.max_length
        if limit is None or args.packing:
            return
        long = sum(len(ids) > limit for ids in episodes["input_ids"])
        if long:
            logger.warning("%d of %d %s episodes are longer than max_length=%d tokens: their later turns are cut off. "
                           "Raise max_length to train on whole episodes.", long, len(episodes), dataset_name, limit)
