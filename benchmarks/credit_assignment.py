"""Credit-assignment benchmark: training episodes until greedy success reaches 90%, per advantage estimator.

The task is a key-and-door corridor with a known optimal policy and 3-4 decisions per episode. The policy is the
tiny offline model of `trl_multiturn.testing` with its output restricted to the four action words (one token each;
a reply is one token, `max_completion_length=1`), so that what is measured is how fast each estimator's credit
turns rewards into the right decisions, not how fast a random model learns to spell. Training uses the real
`MultiTurnGRPOTrainer` (`MultiTurnPPOTrainer` for the critic's estimators, `gae` and `turn_gae`;
`MultiTurnRLOOTrainer` with `--rloo-trainer`) with the same batch of 8 episodes per task per step for every
estimator; greedy success is measured with `trl_multiturn.evaluation.evaluate` on every task after every
`--eval-every` steps. Each seed fixes the initial model, so that within a seed only the estimator differs.

    python benchmarks/credit_assignment.py               # full table: 3 seeds x 4 estimators x {sparse, dense}
    python benchmarks/credit_assignment.py --quick       # one seed, a shorter budget: a smoke run
    python benchmarks/credit_assignment.py --estimators grpo gigpo --reward-modes sparse --seeds 0 1
    python benchmarks/credit_assignment.py --rloo-trainer --estimators rloo turn_rloo --reward-modes sparse
    python benchmarks/credit_assignment.py --estimators gae turn_gae    # the PPO rows (MultiTurnPPOConfig defaults)
    python benchmarks/credit_assignment.py --estimators grpo --max-policy-lag 1   # off-policy, one step behind
    python benchmarks/credit_assignment.py --estimators gigpo --episode-format stepwise --history window:2 full

`--episode-format stepwise` trains each turn as its own sample, its context the `--history` policy's view of the
episode (one row per policy given); greedy evaluation plays the same history. The episodes per step are the same in
both formats, so the episode counts compare directly.

Replies are one token, so each turn is one step for PPO's `gae` and `turn_gae` alike: their rows coincide.

A run that never reaches the target within `--max-steps` is shown as `>N` (N = the episodes it was given).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from trl_multiturn import Environment, StepResult

ACTIONS = ("east", "west", "take", "open")
SYSTEM_PROMPT = "Take the key and open the door."  # short: the template's default system prompt is ~60 tokens


class KeyDoorEnv(Environment):
    """A corridor of `length` rooms, entered at room 0; the key lies in room `key`; a locked door leads east out of
    the last room. Optimal: walk east to the key, `take` it, walk east to the door, `open` it: `length + 1`
    decisions. The environment reads the first word of the reply; any other word, or an action that does not apply
    (west in room 0, take where no key is, open without the key), wastes the turn.

    Rewards (the score change, as TextWorld reports it): 0.5 for taking the key, 0.5 for opening the door (a win).
    Under `reward_mode="sparse"` only the win counts.
    """

    def reset(self, task: dict) -> str:
        self.length, self.key = int(task["length"]), int(task["key"])
        if not 0 <= self.key < self.length:
            raise ValueError(f"task key={self.key} must be a room of the corridor: 0 <= key < length={self.length}")
        self.room, self.holding = 0, False
        return self._observation()

    def step(self, action: str) -> StepResult:
        word = (action.split() or [""])[0].lower()
        reward = 0.0
        if word == "east" and self.room < self.length - 1:
            self.room += 1
        elif word == "west" and self.room > 0:
            self.room -= 1
        elif word == "take" and self.room == self.key and not self.holding:
            self.holding, reward = True, 0.5
        elif word == "open" and self.room == self.length - 1 and self.holding:
            return StepResult("The door opens.", reward=0.5, done=True, won=True)
        return StepResult(self._observation(), reward=reward)

    def _observation(self) -> str:
        """The state and nothing else (an action that changes nothing gives the same observation again), short
        because tokens cost CPU time: e.g. "room 2. key here. door east." or "room 1. with key."."""
        parts = [f"room {self.room}."]
        if self.room == self.key and not self.holding:
            parts.append("key here.")
        if self.room == self.length - 1:
            parts.append("door east.")
        if self.holding:
            parts.append("with key.")
        return " ".join(parts)


def all_tasks(lengths=(2, 3)) -> list[dict]:
    """Every corridor of the given lengths with every key position: 3 decisions (length 2) or 4 (length 3)."""
    return [{"length": n, "key": k} for n in lengths for k in range(n)]


def restrict_vocabulary(model, tokenizer, words=ACTIONS) -> None:
    """Restrict the policy to the action words (each one token, with its leading space) by a frozen output bias of
    -1e4 on every other token. A bias, not a logits hook: TRL's fused log-prob head reads `lm_head.weight` and
    `lm_head.bias` directly, so sampling and the trainer's log-probabilities see the same distribution."""
    allowed = []
    for word in words:
        ids = tokenizer.encode(" " + word, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"action {word!r} is {len(ids)} tokens in this tokenizer; the benchmark needs one each")
        allowed += ids
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    head.weight = old.weight
    bias = torch.full((old.out_features,), -1e4)
    bias[allowed] = 0.0
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    model.set_output_embeddings(head)


def trainer_for(estimator: str, rloo_trainer: bool = False):
    """(trainer class, config class, extra config fields, label): PPO for the critic's estimators (`gae`,
    `turn_gae`), with the KL penalty off as GRPO's is (beta=0), so that only the credit differs; GRPO for every other
    estimator, or RLOO (beta=0) when `rloo_trainer`: one importance ratio per episode for `rloo`, TRL's own
    objective, and one per turn for the turn-level estimators."""
    from trl_multiturn import (
        MultiTurnGRPOConfig,
        MultiTurnGRPOTrainer,
        MultiTurnPPOConfig,
        MultiTurnPPOTrainer,
        MultiTurnRLOOConfig,
        MultiTurnRLOOTrainer,
    )
    from trl_multiturn.credit.gae import VALUE_ESTIMATORS

    if estimator in VALUE_ESTIMATORS:
        return MultiTurnPPOTrainer, MultiTurnPPOConfig, {"kl_coef": 0.0}, f"{estimator} (PPO)"
    if rloo_trainer:
        granularity = "episode" if estimator == "rloo" else "turn"
        return (MultiTurnRLOOTrainer, MultiTurnRLOOConfig, {"beta": 0.0, "loss_granularity": granularity},
                f"{estimator} (RLOO)")
    return MultiTurnGRPOTrainer, MultiTurnGRPOConfig, {}, estimator


def arm_label(estimator: str, rloo_trainer: bool = False, history: str | None = None) -> str:
    """The row label: the trainer's label, and the step-wise history policy where there is one."""
    label = trainer_for(estimator, rloo_trainer)[3]
    return f"{label} stepwise {history}" if history else label


def histories_to_run(episode_format: str, histories: list[str] | None) -> list[str | None]:
    """The history policy of each arm: [None] (the trajectory format), or the step-wise policies given (the
    config's default "full" when none is). A history is refused with the trajectory format, which has none."""
    if episode_format == "trajectory":
        if histories:
            raise ValueError(f"--history {' '.join(histories)} needs --episode-format stepwise")
        return [None]
    return list(histories or ["full"])


@dataclass
class RunResult:
    episodes: int | None  # training episodes when greedy success first reached the target; None if never
    budget: int
    seconds: float  # wall clock
    final_success: float
    cpu_seconds: float = 0.0  # this process's and its reaped children's (the environment workers') user + system


def run(estimator: str, reward_mode: str, seed: int, *, max_steps: int, eval_every: int, num_generations: int,
        learning_rate: float, target: float, hidden_size: int, max_turns: int, turn_gamma: float,
        rloo_trainer: bool, workdir: str, max_policy_lag: int = 0, history: str | None = None) -> RunResult:
    """One training run; `history` None trains trajectories, a history policy (e.g. "window:2") trains step-wise."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from trl_multiturn.evaluation import evaluate
    from trl_multiturn.testing import build_tiny_model

    tasks = all_tasks()
    path = build_tiny_model(os.path.join(workdir, f"model-{seed}"), hidden_size=hidden_size, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    restrict_vocabulary(model, tokenizer)
    batch = len(tasks) * num_generations
    trainer_cls, config_cls, extra, _ = trainer_for(estimator, rloo_trainer)
    args = config_cls(
        output_dir=os.path.join(workdir, f"{estimator}-{reward_mode}-{seed}-{history or 'trajectory'}"),
        advantage_estimator=estimator, reward_mode=reward_mode, max_turns=max_turns, turn_gamma=turn_gamma,
        system_prompt=SYSTEM_PROMPT,
        num_generations=num_generations, per_device_train_batch_size=batch, max_completion_length=1,
        max_steps=max_steps, learning_rate=learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no", seed=seed,
        remove_unused_columns=False, disable_tqdm=True, gradient_checkpointing=False,
        **({"max_policy_lag": max_policy_lag} if max_policy_lag else {}),
        **({"episode_format": "stepwise", "history": history} if history else {}), **extra,
    )
    first_hit: list[int] = []
    success = [0.0]

    def greedy_success() -> float:
        return evaluate(model, KeyDoorEnv, tasks, tokenizer, rules=args.episode_rules()).success_rate

    class StopAtTarget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % eval_every == 0 or state.global_step == max_steps:
                success[0] = greedy_success()
                if success[0] >= target:
                    first_hit.append(state.global_step * batch)
                    control.should_training_stop = True

    trainer = trainer_cls(model=model, args=args, processing_class=tokenizer, environment_factory=KeyDoorEnv,
                          train_dataset=Dataset.from_list(tasks), callbacks=[StopAtTarget()])
    start, cpu_start = time.time(), sum(os.times()[:4])
    success[0] = greedy_success()
    if success[0] >= target:
        first_hit.append(0)
    else:
        trainer.train()
    return RunResult(first_hit[0] if first_hit else None, max_steps * batch, time.time() - start, success[0],
                     sum(os.times()[:4]) - cpu_start)


def format_table(results: dict[tuple[str, str], list[RunResult]], seeds: list[int]) -> str:
    header = ["estimator", "reward", *[f"seed {s}" for s in seeds], "median", "solved", "minutes", "CPU minutes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (estimator, mode), runs in results.items():
        cells = [str(r.episodes) if r.episodes is not None else f">{r.budget}" for r in runs]
        # An unsolved run counts as infinitely many episodes: the median is then exact or shown as unsolved.
        median = statistics.median_high([r.episodes if r.episodes is not None else math.inf for r in runs])
        median_cell = f"{median:g}" if median < math.inf else f">{max(r.budget for r in runs)}"
        solved = f"{sum(r.episodes is not None for r in runs)}/{len(runs)}"
        minutes = [f"{sum(getattr(r, field) for r in runs) / 60:.1f}" for field in ("seconds", "cpu_seconds")]
        lines.append("| " + " | ".join([estimator, mode, *cells, median_cell, solved, *minutes]) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--estimators", nargs="+", default=["grpo", "turn_grpo", "gigpo", "gae"],
                        help="Names in credit.ESTIMATORS (trained with GRPO) or credit.gae.VALUE_ESTIMATORS (PPO).")
    parser.add_argument("--reward-modes", nargs="+", default=["sparse", "dense"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=60, help="Training steps per run at most.")
    parser.add_argument("--max-turns", type=int, default=8, help="Turns per episode (the optimum needs 3 or 4).")
    parser.add_argument("--turn-gamma", type=float, default=1.0, help="Per-turn discount of the returns.")
    parser.add_argument("--eval-every", type=int, default=1, help="Steps between greedy evaluations.")
    parser.add_argument("--num-generations", type=int, default=8, help="Episodes per task per step (group size).")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--hidden-size", type=int, default=64, help="Width of the tiny policy model.")
    parser.add_argument("--target", type=float, default=0.9, help="Greedy success rate to reach.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the model is tiny: 1 is enough).")
    parser.add_argument("--rloo-trainer", action="store_true",
                        help="Train the critic-free estimators with MultiTurnRLOOTrainer instead of GRPO.")
    parser.add_argument("--max-policy-lag", type=int, default=0,
                        help="GRPO's max_policy_lag: each step trains on a rollout played while the step before it "
                        "trained, from weights up to this many steps old (0: on-policy).")
    parser.add_argument("--episode-format", choices=["trajectory", "stepwise"], default="trajectory",
                        help="How episodes become training data (the config's episode_format).")
    parser.add_argument("--history", nargs="+",
                        help="With --episode-format stepwise: the history policies to train with, one arm each "
                        "(e.g. window:1 window:2 full; default full). Evaluation plays the same history.")
    parser.add_argument("--quick", action="store_true", help="One seed and 20 steps: a smoke run of the table.")
    args = parser.parse_args(argv)
    try:
        histories = histories_to_run(args.episode_format, args.history)
    except ValueError as error:
        parser.error(str(error))
    if args.quick:
        args.seeds, args.max_steps = args.seeds[:1], min(args.max_steps, 20)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    results: dict[tuple[str, str], list[RunResult]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for estimator, history in itertools.product(args.estimators, histories):
            for mode in args.reward_modes:
                for seed in args.seeds:
                    result = run(estimator, mode, seed, max_steps=args.max_steps, eval_every=args.eval_every,
                                 num_generations=args.num_generations, learning_rate=args.learning_rate,
                                 target=args.target, hidden_size=args.hidden_size, max_turns=args.max_turns,
                                 turn_gamma=args.turn_gamma, rloo_trainer=args.rloo_trainer, workdir=workdir,
                                 max_policy_lag=args.max_policy_lag, history=history)
                    label = arm_label(estimator, args.rloo_trainer, history)
                    results.setdefault((label, mode), []).append(result)
                    reached = result.episodes if result.episodes is not None else f">{result.budget}"
                    print(f"{label:10s} {mode:7s} seed {seed}: episodes to {args.target:.0%} greedy success "
                          f"{reached} (final {result.final_success:.0%}, {result.seconds:.0f}s wall, "
                          f"{result.cpu_seconds:.0f}s CPU)", flush=True)
    tasks = all_tasks()
    print(f"\nKey-door corridor, {len(tasks)} tasks (3-4 decisions each), {args.num_generations} episodes per task "
          f"per step; episodes until greedy success >= {args.target:.0%}:\n")
    print(format_table(results, args.seeds))


if __name__ == "__main__":
    main()
