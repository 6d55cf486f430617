"""Every forward of a multi-turn step: the policy's log-probs (old, reference, the loss's own, a snapshot's
behaviour log-probs), a distillation teacher's log-probs and PPO's critic values, laid out by the packing plan
(`packing`) or as padded rows, with the log-prob maths of `logprobs`.

`Forwards` is built once by the trainer and handed to the step, the credit and the losses; TRL's
`_get_per_token_logps_and_entropies` is a one-line delegate to `Forwards.logps`, so the ratio pi / pi_old is exactly
1 at a batch's first update whatever the TRL release, and a packed forward replaces the padded one in one place.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import torch
from accelerate.utils import gather_object
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import pad, use_adapter

from .logprobs import sequence_logps
from .packing import (
    PackPlan,
    RowsPlanner,
    choose_plan,
    packed_logps_and_entropies,
    packed_values,
    with_filler_forwards,
)
from .packing_states import ForkPlan

if TYPE_CHECKING:
    from ..rollout import Episode
    from .rows import StepSample
    from .step_tensors import StepTensors


class Forwards:
    """The step's forwards. `model()` and `reference()` give the trainer's current model and reference model (None:
    the policy with its adapter disabled): transformers and PPO replace the model after set-up, so they are read at
    each forward. `args` is the trainer's config (batch sizes, `packing`, gradient checkpointing); `teacher` the
    frozen teacher of on-policy distillation, if any (`distillation.py`)."""

    def __init__(self, model: Callable[[], torch.nn.Module], reference: Callable[[], torch.nn.Module | None],
                 accelerator, args, *, temperature: float, pad_token_id: int, teacher: torch.nn.Module | None = None):
        self.model, self.reference_model, self.teacher_model = model, reference, teacher
        self.accelerator, self.args = accelerator, args
        self.temperature, self.pad_token_id = temperature, pad_token_id
        self.planner = RowsPlanner()  # one prefix-tree plan for every forward of a batch's rows

    def agree(self, plan: PackPlan | None, error: Exception | None = None) -> PackPlan | None:
        """The plan every process runs, from this process's `plan` of its own rows (a `packing.PackPlan`, or a
        hybrid model's `packing_states.ForkPlan` of forked forwards; None: its rows padded). All
        processes must run the same number of forwards (DDP syncs buffers, ZeRO-3 and FSDP gather parameters at each),
        so with n_r the forwards of rank r's plan:

            every rank packed:  each runs its plan with filler forwards up to max_r n_r (`with_filler_forwards`)
            else:               every rank pads its rows (as many rows, so as many forwards, on each)
            a rank's `error`:   every rank raises one error naming each failing rank and its error (a ValueError
                                where each is one, as a "prefix" refusal is; else a RuntimeError)

        `error` is what planning this rank's rows raised (`packing.choose_plan`): raised on that rank alone, it would
        leave the others waiting in this collective until the launcher ended the job. One process: `plan` as it is
        (or `error` raised). A collective: every process calls it at the same forward of the step."""
        if self.accelerator.num_processes == 1:
            if error is not None:
                raise error
            return plan
        local = [int(error is not None), int(plan is None), 0 if plan is None else len(plan.forwards)]
        failed, padded, forwards = self.accelerator.reduce(torch.tensor(local, device=self.accelerator.device),
                                                           reduction="max").tolist()
        if failed:
            mine = [] if error is None else [(self.accelerator.process_index, type(error).__name__, str(error))]
            failures = sorted(gather_object(mine))  # a second collective, on the failing step only
            kind = ValueError if all(name == "ValueError" for _, name, _ in failures) else RuntimeError
            raise kind("; ".join(f"rank {rank} of {self.accelerator.num_processes} could not plan its rows: {name}: "
                                 f"{message}" for rank, name, message in failures)) from error
        return None if padded else with_filler_forwards(plan, forwards, self.pad_token_id)

    def batch_size(self, mode: str) -> int:
        args = self.args
        return args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size

    # -- the policy ---------------------------------------------------------------------------------------------------

    def logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
              compute_aux_loss=False, **multimodal):
        """Every log-prob of a step, TRL's loss's included (its `_get_per_token_logps_and_entropies`): the rows'
        shared prefixes forwarded once (`packing.packed_logps_and_entropies`), or each row whole
        (`logprobs.sequence_logps`), as `packing` says, one plan for every rank (`agree`). Episodes are text:
        multimodal inputs are refused."""
        given = sorted(name for name, value in multimodal.items() if value is not None)
        if given:
            raise ValueError(f"multi-turn episodes are text only; got {given}")
        # MoE's load-balancing loss: the rows' own forwards
        if compute_aux_loss or self.args.packing == "padded":
            return sequence_logps(model, input_ids, attention_mask, logits_to_keep, temperature=self.temperature,
                                  batch_size=batch_size, compute_entropy=compute_entropy,
                                  compute_aux_loss=compute_aux_loss, autocast=self.accelerator.autocast)
        return (*packed_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                            compute_entropy, temperature=self.temperature, packing=self.args.packing,
                                            planner=self.planner,
                                            agree=self.agree if self.accelerator.num_processes > 1 else None,
                                            autocast=self.accelerator.autocast), None)

    def old(self, x: StepTensors, mode: str) -> torch.Tensor:
        """log pi_old of the step's rows: the live policy before any update."""
        model = self.model()
        with torch.no_grad(), disable_gradient_checkpointing(model, self.args.gradient_checkpointing_kwargs):
            return self.logps(model, x.input_ids, x.attention_mask, x.length, batch_size=self.batch_size(mode))[0]

    def reference(self, x: StepTensors, mode: str) -> torch.Tensor:
        """log pi_ref of the step's rows: the reference model, or with PEFT the policy with its adapter disabled (or
        switched to the frozen "ref" adapter TRL adds for a pretrained one)."""
        model, reference = self.model(), self.reference_model()
        with torch.no_grad(), disable_gradient_checkpointing(model, self.args.gradient_checkpointing_kwargs):
            if reference is not None:
                return self.logps(reference, x.input_ids, x.attention_mask, x.length, self.batch_size(mode))[0]
            unwrapped = self.accelerator.unwrap_model(model)
            with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                return self.logps(model, x.input_ids, x.attention_mask, x.length, self.batch_size(mode))[0]

    @torch.no_grad()
    def teacher(self, x: StepTensors, mode: str) -> torch.Tensor:
        """log pi_T of the step's rows under the distillation teacher, laid out as every policy forward is (packed
        where the teacher takes the prefix-tree mask and `packing` chooses it, else padded rows), at the sampling
        temperature the policy's log-probs use."""
        return self.logps(self.teacher_model, x.input_ids, x.attention_mask, x.length, self.batch_size(mode))[0]

    @torch.no_grad()
    def behaviour_logps(self, model, episodes: list[Episode]) -> list[Episode]:
        """`episodes` with `logprobs` the log-probs of their completion tokens under `model` (the weights that
        sampled them); failed episodes and those without a reply as they are."""
        rows = [i for i, ep in enumerate(episodes) if not ep.failed and ep.completion_ids]
        if not rows:
            return episodes

        def padded(name: str, side: str) -> tuple[torch.Tensor, torch.Tensor]:
            lists = [torch.tensor(getattr(episodes[i], name)) for i in rows]
            return (pad(lists, padding_value=self.pad_token_id, padding_side=side),
                    pad([torch.ones_like(ids) for ids in lists], padding_value=0, padding_side=side))

        (prompt_ids, prompt_mask), (completion_ids, completion_mask) = padded("prompt_ids", "left"), padded(
            "completion_ids", "right")
        device = self.accelerator.device
        logps = self.logps(model, torch.cat([prompt_ids, completion_ids], dim=1).to(device),
                           torch.cat([prompt_mask, completion_mask], dim=1).to(device), completion_ids.shape[1],
                           self.args.per_device_train_batch_size)[0]
        out = list(episodes)
        for row, i in enumerate(rows):
            out[i] = dataclasses.replace(episodes[i], logprobs=logps[row, :len(episodes[i].completion_ids)].tolist())
        return out

    # -- PPO's critic (the model is a `value_model.PolicyAndValueModel`) ---------------------------------------------

    def plan(self, input_ids, attention_mask, length: int, batch_size: int | None) -> PackPlan | ForkPlan | None:
        """The prefix-tree plan by which the critic (and, in PPO's loss, the policy beside it) runs these rows, or
        None for the padded rows: as `packing` chooses (`packing.choose_plan`, over the policy and the critic): a
        `PackPlan` of tree-mask packs, or where both models fork their layer states a `ForkPlan` of forked forwards
        (`packing_states`)."""
        model = self.accelerator.unwrap_model(self.model())
        return choose_plan((model.policy, model.critic), input_ids, attention_mask, length, batch_size,
                           packing=self.args.packing, planner=self.planner, agree=self.agree)

    def values(self, input_ids, attention_mask, length: int, batch_size: int,
               plan: PackPlan | ForkPlan | None) -> torch.Tensor:
        """(rows, length) the critic's V(s_t) of the last `length` tokens, from the head at t - 1 (before token t):
        by `plan` (each shared prefix once, 0 at padding), or `batch_size` padded rows per forward."""
        model = self.model()
        if plan is not None:
            return packed_values(model, plan)
        return torch.cat([
            model(input_ids=input_ids[i: i + batch_size], attention_mask=attention_mask[i: i + batch_size],
                  output="values")[:, -length - 1:-1]
            for i in range(0, input_ids.size(0), batch_size)
        ])

    @torch.no_grad()
    def step_values(self, steps: list[StepSample], batch_size: int) -> list[torch.Tensor]:
        """The critic's values over each step's reply tokens (V before each token), for steps that are no TRL row,
        laid out as TRL lays out its rows (contexts padded on the left, replies on the right): packed, all the steps
        in one plan (an episode's steps share its earlier turns), where `packing` chooses it; else `batch_size` steps
        per forward, every process making as many forwards as the busiest one (sharded models run them together). A
        process without such steps plans a dummy row, so that every process takes part in the plan's agreement."""
        input_ids, attention_mask = self.padded_steps(steps)
        length = max((len(s.completion_ids) for s in steps), default=1)
        several = self.accelerator.num_processes > 1
        plan = self.plan(input_ids, attention_mask, length, batch_size) if steps or several else None
        if plan is not None:
            with self.accelerator.autocast():
                values = packed_values(self.model(), plan)
            return [values[j, :len(s.completion_ids)] for j, s in enumerate(steps)]
        calls = -(-len(steps) // batch_size)
        if self.accelerator.num_processes > 1:
            calls = int(self.accelerator.reduce(torch.tensor([calls], device=self.accelerator.device),
                                                reduction="max").item())
        out = []
        for i in range(calls):
            chunk = steps[i * batch_size: (i + 1) * batch_size]  # empty: a dummy forward for the other processes
            input_ids, attention_mask = self.padded_steps(chunk)
            length = max((len(s.completion_ids) for s in chunk), default=1)
            with self.accelerator.autocast():
                values = self.values(input_ids, attention_mask, length, len(input_ids), None)
            out.extend(values[j, :len(s.completion_ids)] for j, s in enumerate(chunk))
        return out

    def padded_steps(self, steps: list[StepSample]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) of `steps` as TRL lays out its rows: contexts padded on the left, replies on
        the right; no steps: one row of a pad token and a one-token reply (a dummy forward)."""
        device, pad_id = self.accelerator.device, self.pad_token_id
        contexts = [torch.tensor(ids, device=device) for ids in [s.prompt_ids for s in steps] or [[pad_id]]]
        replies = [torch.tensor(ids, device=device) for ids in [s.completion_ids for s in steps] or [[pad_id]]]
        return (torch.cat([pad(contexts, pad_id, "left"), pad(replies, pad_id, "right")], dim=1),
                torch.cat([pad([torch.ones_like(c) for c in contexts], 0, "left"),
                           pad([torch.ones_like(r) for r in replies], 0, "right")], dim=1))
