"""`MultiTurnDAggerTrainer`: DAgger (Ross, Gordon & Bagnell, 2011) from an environment's expert, on the SFT path.

Each iteration plays one episode per task under the mixture policy (the expert acts with probability beta_i at each
turn, the student otherwise), labels every state reached with the environment's expert action
(`Environment.expert_action`), adds those examples to the aggregated dataset, and trains on it supervised, exactly as
`MultiTurnSFTTrainer` trains: only the expert action's tokens (its end-of-turn token included) carry a loss.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import datasets

from ..config_checks import Range, config_field
from ..expert import dagger_beta, dagger_episodes, require_expert_action
from ..rollout.generation import hf_generate_fn
from ..rollout.rules import rule_fields
from .sft import MultiTurnSFTConfig, MultiTurnSFTTrainer

logger = logging.getLogger(__name__)


@dataclass
@rule_fields(names=("max_turns", "max_completion_length"))
class MultiTurnDAggerConfig(MultiTurnSFTConfig):
    """`MultiTurnSFTConfig` plus DAgger's schedule and the rules the student plays by.

    Every iteration trains on the aggregated dataset for `num_train_epochs` (or `max_steps`), from the weights the
    previous iteration left, with a fresh optimizer and learning-rate schedule (`Trainer.train()` per iteration).

    Parameters:
        > Parameters that control the episode (rules of play, `EpisodeRules`: give them the RL recipe's values)

        max_turns (`int`, defaults to `8`):
            The most replies in one episode.
        max_completion_length (`int`, defaults to `32`):
            The most tokens of one student reply.

        > Parameters that control DAgger

        dagger_iterations (`int`, defaults to `4`):
            How many rounds of playing, labelling and training.
        dagger_beta_0 (`float`, defaults to `1.0`):
            Probability that the expert acts at a turn of the first iteration.
        dagger_beta_decay (`float`, defaults to `0.5`):
            Factor p of the schedule beta_i = beta_0 * p**i.
        dagger_max_examples (`int`, *optional*):
            Cap on the aggregated dataset; the oldest examples leave first.
        dagger_temperature (`float`, defaults to `0.0`):
            Sampling temperature of the student's replies (0: greedy).
    """

    # Parameters that control the episode: `max_turns`, `max_completion_length` (`rule_fields`)

    # Parameters that control DAgger
    dagger_iterations: int = config_field(
        4, "How many DAgger iterations: each plays one episode per task of `train_dataset` under the mixture policy, "
        "labels every state reached with the environment's expert action and trains on the aggregated dataset.",
        range=Range(ge=1))
    dagger_beta_0: float = config_field(
        1.0, "Probability that the expert acts (instead of the student) at each turn of the first iteration: 1 makes "
        "it behaviour cloning on the expert's own states.", range=Range(ge=0, le=1))
    dagger_beta_decay: float = config_field(
        0.5, "Factor p of DAgger's schedule beta_i = dagger_beta_0 * p**i (iteration i counted from 0); 0: the "
        "student alone acts from the second iteration on.", range=Range(ge=0, le=1))
    dagger_max_examples: int | None = config_field(
        None, "Cap on the aggregated dataset (labelled states); past it the oldest examples leave first. None: "
        "every iteration's examples are kept, as DAgger defines it.", range=Range(ge=1))
    dagger_temperature: float = config_field(
        0.0, "Sampling temperature of the student's replies while playing (0: greedy, the policy evaluation plays).",
        range=Range(ge=0))


class MultiTurnDAggerTrainer(MultiTurnSFTTrainer):
    """DAgger on multi-turn episodes: the student's states, the expert's actions, SFT's token-exact loss.

    Same arguments as `MultiTurnSFTTrainer`; `train_dataset` holds task rows (what the RL trainers take) and
    `environment_factory` is required and must build an environment with `expert_action()` (TextWorld's and
    ALFWorld's have one): one without is refused here, in one line. `train()` runs `dagger_iterations` iterations;
    `dagger_log` holds each one's numbers (beta, episodes, wins, turns, the student's agreement with the expert,
    examples added and aggregated), which are also logged as `dagger/*` after its training. Each iteration's training
    counts its steps from 0 (`Trainer.train()` per iteration); `state.log_history` holds every iteration's records.
    """

    _tag_names = ["trl", "sft", "dagger", "trl-multiturn"]

    def __init__(self, model, args: MultiTurnDAggerConfig | None = None, *pargs, environment_factory=None, **kwargs):
        if environment_factory is None:
            raise ValueError("MultiTurnDAggerTrainer plays the student in an environment: pass `environment_factory` "
                             "(e.g. TextWorldEnv), whose environments implement `expert_action()`")
        env = environment_factory()
        try:
            require_expert_action(env)
        finally:
            env.close()
        self.tasks: list[dict] | None = None  # the task rows, taken by `_prepare_dataset` during TRL's __init__
        self.dagger_log: list[dict] = []
        super().__init__(model, args, *pargs, environment_factory=environment_factory, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
        if dataset_name == "train" and self.tasks is None:
            self.tasks = [dict(row) for row in dataset]  # played by `train()`; the examples come from its iterations
            if not self.tasks:
                raise ValueError("The train dataset holds no task rows: DAgger plays one episode per task row.")
            return dataset
        return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        if resume_from_checkpoint:
            raise ValueError("MultiTurnDAggerTrainer cannot resume from a checkpoint: its aggregated dataset is not "
                             "saved. Start a new run from the checkpoint's weights (pass its path as `model`).")
        args = self.args
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        builder = self.episode_token_builder(tokenizer)
        rng = random.Random(args.seed)
        aggregated: list[dict] = []
        history: list[dict] = []  # every iteration's log: each `Trainer.train()` starts a new TrainerState
        output = None
        env = self.environment_factory()
        try:
            for iteration in range(args.dagger_iterations):
                beta = dagger_beta(iteration, args.dagger_beta_0, args.dagger_beta_decay)
                model = self.accelerator.unwrap_model(self.model)
                generate = hf_generate_fn(model, tokenizer, builder.eos_token_ids,
                                          temperature=args.dagger_temperature)
                was_training = model.training
                model.eval()
                try:
                    rows, stats = dagger_episodes(
                        env, self.tasks, generate, builder, beta=beta, rng=rng, max_turns=args.max_turns,
                        max_completion_length=args.max_completion_length, system_prompt=args.system_prompt,
                        action_parser=args.action_parser,
                    )
                finally:
                    model.train(was_training)
                aggregated = aggregated + [{**row, "iteration": iteration} for row in rows]
                if args.dagger_max_examples is not None:
                    aggregated = aggregated[-args.dagger_max_examples:]
                record = self._iteration_record(iteration, beta, stats, len(rows), len(aggregated))
                logger.info("DAgger iteration %d: %s", iteration, record)
                self.train_dataset = super()._prepare_dataset(
                    datasets.Dataset.from_list(aggregated), self.processing_class, args, args.packing, None, "train")
                self.optimizer, self.lr_scheduler = None, None  # each iteration: a fresh optimizer and schedule
                output = super().train(trial=trial, ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
                self.dagger_log.append(record)
                self.log({f"dagger/{name}": value for name, value in record.items() if value is not None})
                history += self.state.log_history
        finally:
            env.close()
        self.state.log_history = history
        return output

    @staticmethod
    def _iteration_record(iteration: int, beta: float, stats: dict, added: int, aggregated: int) -> dict:
        """One iteration's numbers: `stats` of `dagger_episodes`, the student's agreement with the expert (the
        fraction of its turns whose action was the expert's; None when it did not act) and the dataset's size."""
        agreement = stats["student_agreed"] / stats["student_turns"] if stats["student_turns"] else None
        return {"iteration": iteration, "beta": beta, **stats, "student_agreement": agreement,
                "examples_added": added, "examples": aggregated}
