"""Tiny offline models and a fault-injecting toy environment for tests, benchmarks and demos.

`build_tiny_model(out_dir, template="chatml")` trains a byte-level BPE tokenizer in-process (no Hub), attaches a
real chat template (Qwen2.5's ChatML, Llama 3's, or Qwen3's, which rewrites history by stripping earlier turns'
reasoning; as TRL ships them), builds a randomly initialised Llama-style
model a few layers deep, and saves both so that TRL can reload them by path. `FaultyEnv` breaks the environment
contract on purpose, in every way the rollout must contain to one episode.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .envs.base import Environment, StepResult

CHAT_TEMPLATES = ("chatml", "llama3")
"""The tiny templates multi-turn rollouts extend as they are."""
HISTORY_REWRITING_TEMPLATES = ("qwen3",)
"""Tiny templates that rewrite earlier turns (refused as they are; TRL ships a training version of each)."""

_SPECIAL_TOKENS = {
    "chatml": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "extra": ["<|im_start|>"]},
    "qwen3": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "extra": ["<|im_start|>"]},
    "llama3": {
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": "<|finetune_right_pad_id|>",
        "extra": ["<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"],
    },
}
_TRL_TEMPLATE_FILES = {"chatml": "qwen2_5.jinja", "llama3": "llama3.jinja", "qwen3": "qwen3.jinja"}

_CORPUS = [
    "You are in a kitchen. There is a closed fridge and a wooden table here. Exits lead north and east.",
    "go north. go south. go east. go west. take the key. open the chest. unlock the door with the key.",
    "insert the apple into the box. put the book on the shelf. look. inventory. examine the lamp.",
    "Your task is to: put a clean mug in the coffeemachine. heat some potato and put it in sinkbasin.",
    "run ls -la; view src/app.py 1 40; replace a string in a file; submit the patch; pytest -q tests",
    "def add(a, b):\n    return a + b\n\nclass Stack:\n    pass\n",
    "Valid actions: go north, take coin, open door. Score: 1/3. You won! You lost. *** The End ***",
    "0123456789 !?.,:;'\"()[]{}<>=+-*/_#@$%^&|~`",
]


def build_tiny_tokenizer(template: str = "chatml", vocab_size: int = 600):
    """A byte-level BPE tokenizer trained in-process, with `template`'s special tokens and chat template."""
    if template not in CHAT_TEMPLATES + HISTORY_REWRITING_TEMPLATES:
        raise ValueError(f"template={template!r}: choose one of {CHAT_TEMPLATES + HISTORY_REWRITING_TEMPLATES}")
    return train_tiny_tokenizer(_SPECIAL_TOKENS[template], trl_chat_template(_TRL_TEMPLATE_FILES[template]),
                                vocab_size)


def train_tiny_tokenizer(spec: dict, chat_template: str, vocab_size: int = 600):
    """A byte-level BPE tokenizer trained in-process on a small corpus, with the special tokens of `spec` ("bos",
    "eos", "pad": a token or None; "extra": a list) and `chat_template`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [t for t in (spec["bos"], spec["eos"], spec["pad"], *spec["extra"]) if t]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["pad"],
        additional_special_tokens=spec["extra"],
    )
    fast.chat_template = chat_template
    return fast


def trl_chat_template(filename: str) -> str:
    """The text of TRL's chat template `filename` (in `trl/chat_templates/`)."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / filename).read_text()


def build_tiny_model(out_dir: str | os.PathLike, template: str = "chatml", hidden_size: int = 32, num_layers: int = 2,
                     seed: int = 0) -> str:
    """Save a tiny random Llama-style causal LM and its tokenizer to `out_dir`; return the path."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(template)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    out_dir = str(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


FAULTS = ("raise", "hang", "exit", "nan_reward", "none_reward", "bad_observation", "huge_observation")


class FaultyEnv(Environment):
    """A toy game that breaks on purpose, for fault tests and the soak benchmark (a test double of a *user*
    environment, not of a real engine).

    Each turn earns reward 1 and the episode is won after `task["target"]` turns (default 2). `task["fault"]`, one
    of `FAULTS` or absent, breaks it at turn `task.get("fault_turn", 1)`: "raise" an exception, "hang" (sleep
    `hang_seconds`), "exit" the process (a lost worker), return a NaN ("nan_reward") or None ("none_reward")
    reward, an observation that is not a string ("bad_observation"); "huge_observation" makes the first
    observation `huge_words` words long, more than an episode budget holds. With `closed_dir`, `close()` leaves a
    file named after the task's "id" there, so a test in another process sees which environments were closed.
    """

    def __init__(self, hang_seconds: float = 3600.0, huge_words: int = 2000, closed_dir: str | None = None):
        self.hang_seconds, self.huge_words, self.closed_dir = hang_seconds, huge_words, closed_dir
        self.task_id = None

    def reset(self, task):
        self.task_id = task.get("id")
        self.turn, self.target = 0, task.get("target", 2)
        self.fault, self.fault_turn = task.get("fault"), task.get("fault_turn", 1)
        if self.fault == "huge_observation":
            return "look around. " * self.huge_words
        return f"Reach turn {self.target}. Say anything."

    def step(self, action):
        self.turn += 1
        if self.turn == self.fault_turn:
            if self.fault == "raise":
                raise RuntimeError("injected crash")
            if self.fault == "hang":
                time.sleep(self.hang_seconds)
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "nan_reward":
                return StepResult(f"Turn {self.turn}.", reward=float("nan"))
            if self.fault == "none_reward":
                return StepResult(f"Turn {self.turn}.", reward=None)
            if self.fault == "bad_observation":
                return StepResult({"text": f"Turn {self.turn}."}, reward=1.0)
        done = self.turn >= self.target
        return StepResult(f"Turn {self.turn}.", reward=1.0, done=done, won=done)

    def close(self):
        if self.closed_dir is not None and self.task_id is not None:
            open(os.path.join(self.closed_dir, str(self.task_id)), "w").close()
