"""On-policy distillation's maths: a teacher's per-token signal on the student's own sampled tokens.

The student pi samples every reply of its episodes; a teacher pi_T scores the same tokens. The reverse KL
KL(pi || pi_T) of one position, estimated from its one sampled token y_t, is log pi(y_t | y_<t) - log pi_T(y_t | y_<t):
its negative is a dense per-token reward that is 0 where the teacher agrees with the student and negative where the
student puts more mass on its token than the teacher does. Only the tokens the model sampled (the trained mask m)
get one: observation and template tokens were never sampled, so they carry no reward.
"""

from __future__ import annotations

import torch


def reverse_kl_rewards(student_logps: torch.Tensor, teacher_logps: torch.Tensor, trained: torch.Tensor,
                       coef: float) -> torch.Tensor:
    """(B, T) per-token teacher rewards on the student's sampled tokens:

        r_t = -coef * (log pi(y_t | y_<t) - log pi_T(y_t | y_<t)) * m_t

    with `student_logps` log pi (the policy that sampled the batch, before any update), `teacher_logps` log pi_T,
    both (B, T) over the completion columns, and `trained` m (1 on the sampled tokens the loss trains on, 0 on
    observations, template tokens and padding). Exactly 0 where m is 0, whatever the log-probs hold there."""
    if coef < 0:
        raise ValueError(f"coef={coef}: the teacher's weight must be >= 0")
    mask = trained.to(torch.bool)
    return torch.where(mask, -coef * (student_logps - teacher_logps), torch.zeros_like(student_logps))


def teacher_reward_share(teacher_total: float, environment_total: float) -> float:
    """The teacher's share of the reward's magnitude in a batch:

        share = sum_t |r_t| / (sum_t |r_t| + sum_{i,k} |R_ik|)

    `teacher_total` the sum of |r_t| over the sampled tokens, `environment_total` the sum of |R_ik|, the other reward
    sources' per-turn rewards (the environment's and the weighted reward functions'). 0 with no teacher signal, 1 with
    nothing else; 0 when both are 0."""
    total = teacher_total + environment_total
    return teacher_total / total if total > 0 else 0.0
