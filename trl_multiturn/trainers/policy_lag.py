"""Off-policy training with a bounded policy lag (`max_policy_lag`, docs/policy_lag.md).

With `max_policy_lag = k >= 1` the rollout a training step learns from is played while the previous step trains, by
a background thread, from a snapshot of the policy: a copy of the model whose weights are refreshed (one
`load_state_dict`) only when the next rollout would otherwise be sampled from weights more than k optimizer steps
old. Each episode carries the version of the weights it was sampled from (the number of optimizer steps they had
taken) and its behaviour log-probs (one forward pass of the snapshot over the sampled tokens, TRL's own
log-prob function); the loss multiplies each sampled token by its truncated importance weight
(`importance.importance_weights`, "token_truncate": per token, so an episode's weight does not depend on its
length). The snapshot samples with its own seeded `torch.Generator`, so what it plays depends on the step and the
weights only, never on how the two threads interleave: resume is exact.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor

import torch


def snapshot_is_due(next_use_step: int, snapshot_version: int | None, max_lag: int) -> bool:
    """Whether the snapshot must be refreshed before sampling a rollout that trains at optimizer step
    `next_use_step`: when there is none yet, or its weights would then be more than `max_lag` steps old."""
    return snapshot_version is None or next_use_step - snapshot_version > max_lag


def stale_episodes(versions: list[int], current_version: int, max_lag: int) -> list[bool]:
    """Per episode, whether its lag `current_version - version` exceeds `max_lag` (it is then dropped)."""
    return [current_version - v > max_lag for v in versions]


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of `model` whose forward runs the copy's weights. A forward set on the instance (TRL's fused LM
    head, a closure over the original model's forward) is dropped from the copy: a deep copy keeps the closure and
    would compute with the live weights; every log-prob of a step comes from the plain forward
    (`logprobs.sequence_logps`)."""
    snapshot = copy.deepcopy(model).requires_grad_(False)
    vars(snapshot).pop("forward", None)
    return snapshot


class LaggedRollouts:
    """The rollouts of the off-policy schedule: each `take(inputs, step)` returns a rollout played earlier (the one
    started at the previous `take`, or at the first call one played now) and starts the next one, on TRL's rows of
    this step, in the background.

    `play(snapshot, generator_seed, inputs)` plays the rows through the snapshot and returns its episodes with
    their behaviour log-probs (each rollout's generator seed is the step that trains it); `live_model()` is the
    model being trained, of which the snapshot is a `frozen_copy`;
    `steps_per_rollout`: the optimizer steps between two rollouts (TRL generates every
    `steps_per_generation * num_iterations` micro batches).
    """

    def __init__(self, live_model, play, max_lag: int, steps_per_rollout: int, seed: int):
        self.live_model, self.play = live_model, play
        self.max_lag, self.steps_per_rollout, self.seed = max_lag, steps_per_rollout, seed
        self.snapshot: torch.nn.Module | None = None
        self.version: int | None = None
        self._pending: Future | None = None
        self._restored: dict | None = None  # a checkpoint's `state`, applied at the next `take`
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-lag-rollout")

    def take(self, inputs: list[dict], step: int) -> tuple[list[dict], list, int]:
        """`(rows, episodes, version)` for training at optimizer step `step`: TRL's rows the episodes played, and
        the version of the weights that played them. Starts the rollout of `inputs` for step
        `step + steps_per_rollout`."""
        if self._restored is not None:
            self._apply(self._restored)
            self._restored = None
        if self._pending is None:  # the first step (or a resumed run without a saved rollout): on-policy, now
            self._sync(step)
            played = self._submit(inputs, step).result()
        else:
            played = self._pending.result()
        self._pending = None
        if snapshot_is_due(step + self.steps_per_rollout, self.version, self.max_lag):
            self._sync(step)
        self._pending = self._submit(inputs, step + self.steps_per_rollout)
        return played

    def _submit(self, inputs: list[dict], use_step: int) -> Future:
        """Play `inputs` in the background for training at `use_step`, the step its generator is seeded from."""
        version, seed = self.version, self.seed * 1_000_003 + use_step
        return self._executor.submit(lambda: (inputs, self.play(self.snapshot, seed, inputs), version))

    def _sync(self, step: int) -> None:
        """Copy the live weights into the snapshot (a `frozen_copy` of it the first time)."""
        if self.snapshot is None:
            self.snapshot = frozen_copy(self.live_model())
        else:
            self.snapshot.load_state_dict(self.live_model().state_dict())
        self.version = step

    def state(self, step: int) -> dict:
        """What a checkpoint at optimizer step `step` needs to go on exactly: the rollout in flight (waited for),
        and the snapshot's weights when the next rollout is still to be sampled from them."""
        pending = self._pending.result() if self._pending is not None else None
        keep = self.version is not None and not snapshot_is_due(step + self.steps_per_rollout, self.version,
                                                                self.max_lag)
        return {"pending": pending, "version": self.version,
                "snapshot": self.snapshot.state_dict() if keep else None}

    def load_state(self, state: dict) -> None:
        """Go on from a checkpoint's `state(...)`, from the next `take` on (the model holds the checkpoint's weights
        by then)."""
        self._restored = state

    def _apply(self, state: dict) -> None:
        if state["pending"] is not None:
            self._pending = Future()
            self._pending.set_result(state["pending"])
        if state["snapshot"] is not None:
            self.snapshot = frozen_copy(self.live_model())
            self.snapshot.load_state_dict(state["snapshot"])
            self.version = state["version"]

    def close(self) -> None:
        """Wait for the rollout in flight (a thread cannot be stopped) and drop it."""
        if self._pending is not None:
            self._pending.exception()  # waits; an error of a rollout nobody will train on is not raised
            self._pending = None
