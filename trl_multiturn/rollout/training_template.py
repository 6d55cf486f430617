"""Choosing a chat template that multi-turn rollouts can extend token by token.

Some templates rewrite history: Qwen3's strips the reasoning of earlier assistant turns, so the tokens of a turn
change once a later turn exists, and `ChatTokenBuilder` refuses them. Two settings fix that without code:

- `chat_template_path`: a Jinja file (or a folder holding `chat_template.jinja`) that replaces the tokenizer's
  template;
- `use_training_chat_template` (on by default): when the template cannot be extended token-exactly, switch to the
  prefix-preserving training version TRL ships for it (`trl.chat_template_utils.get_training_chat_template`, the
  `*_training.jinja` files), with a log line. Templates that already work are never switched.

The tokenizer keeps the template it was given here, so a saved model is evaluated with the template it trained with.
"""

from __future__ import annotations

import logging
from dataclasses import field
from pathlib import Path

from .chat_tokens import ChatTemplateError, ChatTokenBuilder

logger = logging.getLogger(__name__)


def use_training_chat_template_field():
    """The `use_training_chat_template` config field of the RL and SFT configs."""
    return field(
        default=True,
        metadata={"help": "When the tokenizer's template rewrites earlier turns (e.g. Qwen3's strips their "
                          "reasoning), so that episodes cannot be extended token-exactly, switch to TRL's training "
                          "version of it (get_training_chat_template), with a log line. False: refuse such "
                          "templates. Templates that work are never switched; `chat_template_path` replaces the "
                          "template outright."},
    )


def read_chat_template(path: str) -> str:
    """The template text of `path`: a Jinja file, or a folder holding `chat_template.jinja`."""
    file = Path(path)
    if file.is_dir():
        file = file / "chat_template.jinja"
    if not file.is_file():
        raise ValueError(f"chat_template_path={path!r}: no such file. Give a Jinja chat template file (or a folder "
                         "holding chat_template.jinja), e.g. one of trl/chat_templates/*_training.jinja.")
    return file.read_text()


def prepare_chat_template(tokenizer, chat_template_path: str | None = None, use_training_chat_template: bool = True,
                          eos_token_ids=None, chat_template_kwargs: dict | None = None) -> str:
    """Set `tokenizer.chat_template` to one that rollouts can extend token-exactly and say which it is: "path"
    (from `chat_template_path`), "training" (switched to TRL's training template) or "own" (the tokenizer's, as it
    was). Raises `ChatTemplateError` when none works, naming the settings that would fix it."""
    if chat_template_path:
        tokenizer.chat_template = read_chat_template(chat_template_path)
        logger.info("Using the chat template of chat_template_path=%r", chat_template_path)
        ChatTokenBuilder(tokenizer, eos_token_ids, chat_template_kwargs)
        return "path"
    try:
        ChatTokenBuilder(tokenizer, eos_token_ids, chat_template_kwargs)
        return "own"
    except ChatTemplateError as refusal:
        if not use_training_chat_template:
            raise
        training = _training_template(tokenizer)
        if training is None:
            raise ChatTemplateError(f"{refusal} TRL ships no training template for this one: give "
                                    "chat_template_path.") from None
    own = tokenizer.chat_template
    tokenizer.chat_template = training
    try:
        ChatTokenBuilder(tokenizer, eos_token_ids, chat_template_kwargs)
    except ChatTemplateError:
        tokenizer.chat_template = own
        raise
    logger.warning("The chat template of %r rewrites earlier turns, which multi-turn rollouts cannot extend "
                   "token-exactly: switched to TRL's training version of it (get_training_chat_template). Set "
                   "use_training_chat_template=False to refuse instead, or chat_template_path to choose one.",
                   tokenizer.name_or_path)
    return "training"


def _training_template(tokenizer) -> str | None:
    from trl.chat_template_utils import get_training_chat_template

    try:
        return get_training_chat_template(tokenizer)
    except ValueError:  # TRL knows no training version of this template
        return None
