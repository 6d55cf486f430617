"""On-policy distillation, multi-turn: a teacher model scores every token the student sampled in its episodes.

The step's part `Distillation` runs the teacher's forward over the step's rows (`forwards.Forwards.teacher`: packed
as the reference's, padded where the teacher cannot take the packed mask) and turns the student's and the teacher's
log-probs of the sampled tokens into per-token rewards (`credit.distillation.reverse_kl_rewards`):

    r_t = -teacher_kl_coef * (log pi_old(y_t | y_<t) - log pi_T(y_t | y_<t))    on each sampled (trained) token

`teacher_signal` says where they go: 'reward' adds them to the environment's reward through the trainer's credit
(GRPO, RLOO: each turn's sum joins that turn's reward before the advantage estimator; PPO: each token's joins its
token reward before GAE), 'loss' makes them the advantages themselves (the environment's return is still played,
scored and logged, but trains nothing). Observation tokens are never sampled, so they get no teacher reward.

A teacher must read the student's tokens as the student does: `check_teacher_vocabulary` refuses, at the trainer's
start, a teacher whose tokenizer maps any token to another id than the student's, or whose logits do not cover
every id of the student's tokenizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..credit.distillation import reverse_kl_rewards, teacher_reward_share
from .estimator_credit import with_trajectory_rewards

if TYPE_CHECKING:
    from .batch import RolloutBatch
    from .forwards import Forwards
    from .step_log import StepLog
    from .step_tensors import StepTensors

TEACHER_SIGNALS = ("reward", "loss")
"""`teacher_signal` values: 'reward' (added to the environment's reward, through the credit), 'loss' (the teacher's
per-token reward alone is the advantage)."""


def vocabulary_refusal(student_tokenizer, teacher_tokenizer, teacher_vocab_size: int) -> str | None:
    """Why a teacher cannot score the student's tokens, or None: its logits (`teacher_vocab_size` rows) do not cover
    every id of the student's tokenizer, or its tokenizer (None: not known, only the size is checked) maps a token
    to another id than the student's (the full vocabulary, added and special tokens included: the chat template's
    markers are among them)."""
    needed = len(student_tokenizer)
    if teacher_vocab_size < needed:
        return (f"its logits cover {teacher_vocab_size} token ids, the student's tokenizer has {needed}: use a "
                "teacher that shares the student's tokenizer")
    if teacher_tokenizer is None:
        return None
    student, teacher = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    differ = sorted(token for token in student.keys() | teacher.keys() if student.get(token) != teacher.get(token))
    if not differ:
        return None
    token = differ[0]
    return (f"its tokenizer differs from the student's on {len(differ)} tokens (e.g. {token!r}: the student's id "
            f"{student.get(token)}, the teacher's {teacher.get(token)}): use a teacher that shares the student's "
            "tokenizer (the same family's vocabulary)")


def teacher_tokenizer(teacher: str | torch.nn.Module):
    """The tokenizer saved with the teacher (its path, or a model object's `name_or_path`), or None where there is
    none to load (a model built in memory)."""
    from transformers import AutoTokenizer

    path = teacher if isinstance(teacher, str) else getattr(teacher, "name_or_path", "")
    if not path:
        return None
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        if isinstance(teacher, str):
            raise
        return None


def check_teacher_vocabulary(student_tokenizer, teacher: torch.nn.Module, given: str | torch.nn.Module) -> None:
    """Refuse, in one line, a `teacher` (loaded from `given`) whose vocabulary is not the student's
    (`vocabulary_refusal`)."""
    rows = teacher.get_output_embeddings().weight.shape[0]
    refusal = vocabulary_refusal(student_tokenizer, teacher_tokenizer(given), rows)
    if refusal:
        name = given if isinstance(given, str) else type(given).__name__
        raise ValueError(f"teacher_model={name!r}: {refusal}")


class Distillation:
    """The step's teacher (see the module docstring): `distillation(batch, x, student_logps) -> (B, T)` per-token
    teacher rewards, logged as `teacher/reverse_kl` (the mean of log pi_old - log pi_T per trained token, over all
    processes) and `teacher/reward_share` (`credit.distillation.teacher_reward_share` of this batch, against the
    other reward sources' weighted per-turn rewards)."""

    def __init__(self, forwards: Forwards, log: StepLog, accelerator, *, coef: float, signal: str):
        if signal not in TEACHER_SIGNALS:
            raise ValueError(f"teacher_signal={signal!r}: choose one of {TEACHER_SIGNALS}")
        self.forwards, self.log, self.accelerator = forwards, log, accelerator
        self.coef, self.signal = coef, signal

    @property
    def alone(self) -> bool:
        """Whether the teacher's rewards are the advantages (`teacher_signal='loss'`)."""
        return self.signal == "loss"

    def __call__(self, batch: RolloutBatch, x: StepTensors, student_logps: torch.Tensor) -> torch.Tensor:
        teacher_logps = self.forwards.teacher(x, batch.mode)
        rewards = reverse_kl_rewards(student_logps, teacher_logps, x.trained, self.coef)
        self.log.masked_mean(batch.mode, "teacher/reverse_kl", student_logps - teacher_logps, x.trained)
        others = 0.0
        if not self.alone:
            turn_rewards = with_trajectory_rewards([list(r) for r in batch.turn_rewards], batch.local_scores(),
                                                   batch.reward_weights, self.log.reward_names)
            others = sum(abs(r) for ep, turns in zip(batch.episodes, turn_rewards) if not ep.failed for r in turns)
        totals = self.accelerator.reduce(torch.tensor([rewards.abs().sum().item(), others], device=rewards.device),
                                         reduction="sum").tolist()
        self.log.metrics[batch.mode]["teacher/reward_share"].append(teacher_reward_share(*totals))
        return rewards
