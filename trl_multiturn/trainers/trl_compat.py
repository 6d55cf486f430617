"""Every private TRL and transformers API the trainers rely on, in one table, checked when a trainer is built.

The trainers override or call private methods of TRL's trainers (and of transformers' `Trainer`), swap a loader
while TRL's `__init__` runs, and read attributes TRL's `__init__` sets. None of that is a public API: a TRL release
may change it without notice (TRL's development branch already changed `_generate_single_turn`). `TOUCH_POINTS`
lists each one with the parameters we rely on; `check_trl_compat` compares them with the installed TRL (cheap,
`inspect`, once per trainer class) and raises `TRLCompatibilityError` naming the supported TRL versions and every
difference, before a run starts rather than in the middle of it.

The calls whose shape differs between TRL's trainers go through one adapter here: `single_turn_replies` (GRPO's and
RLOO's `_generate_single_turn` differ in parameters and return value) and `generate_result` (below).

Two further couplings are behaviours, not signatures, and are checked in the source TRL ships:
- `GRPOTrainer._generate` returns a positional 8-tuple; `generate_result` builds it by name, in the order that
  `_generate_and_score_completions` unpacks it (`GENERATE_FIELDS`, checked against TRL's unpacking).
- `GRPOTrainer._compute_loss` multiplies the completion mask by `inputs["tool_mask"]`: the hook that keeps
  observation tokens out of the loss; `_generate_and_score_completions` outputs the keys in `OUTPUT_KEYS`.
Two more are covered by tests rather than here: `MultiTurnPPOConfig` passes `num_generations=1` through
`GRPOConfig`'s "< 2" check with an `int` subclass (`ppo._GroupOfOne`), and `MultiTurnPPOTrainer` sets `beta`
non-zero while TRL's `__init__` runs so that TRL builds a reference model (tests/test_ppo.py).

Why not TRL's public `rollout_func` instead of `_generate_and_score_completions`: in TRL 1.16 it returns the
sampled ids and log-probs (and an `env_mask`, and extra fields for the reward functions), after which TRL computes
one advantage per completion from its summed rewards. Per-turn credit, failed episodes left out of the baselines
and PPO's critic targets need the step's data after the rollout and before the advantages, which only the override
gives; `rollout_func` is also marked experimental.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import textwrap
from dataclasses import dataclass

SUPPORTED_TRL = "1.16.x"
"""The TRL releases whose private API matches `TOUCH_POINTS` (pyproject.toml: trl==1.16.*)."""

GENERATE_FIELDS = ("prompt_ids_list", "completion_ids_list", "tool_mask_list", "completions",
                   "sampling_per_token_logps_list", "extra_fields", "images", "tool_images")
"""The names `GRPOTrainer._generate_and_score_completions` gives the items of `_generate`'s tuple, in order."""


class TRLCompatibilityError(RuntimeError):
    """The installed TRL differs from the private API the trainers rely on."""


@dataclass(frozen=True)
class TouchPoint:
    """One private name of TRL or transformers that the trainers use.

    `owner` is a class ("module:Class") or a module ("module"); `parameters` the parameter names (without `self`)
    we rely on, in order. `exact`: the whole parameter list must match (we override the method, so TRL calls ours
    with its arguments); otherwise the listed names must come first, the `keywords` we pass by name must exist, and
    any further parameter needs a default (we call it). `parameters=None`: only the attribute's existence is
    checked (an instance attribute of the trainer when `instance` is set, read after TRL's `__init__`). A touch
    point applies to the trainers with its owner class among their bases or its owner module defining one of their
    bases; a `shared` one (a TRL helper) to all.
    """

    owner: str
    name: str
    parameters: tuple[str, ...] | None
    use: str
    keywords: tuple[str, ...] = ()
    exact: bool = False
    instance: bool = False
    shared: bool = False
    needs: str | None = None  # an optional package without which the touch point is not used


GRPO = "trl.trainer.grpo_trainer:GRPOTrainer"
RLOO = "trl.trainer.rloo_trainer:RLOOTrainer"
SFT = "trl.trainer.sft_trainer:SFTTrainer"
TRAINER = "transformers.trainer:Trainer"
_LOGPS = ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size")
_LOGPS_KEYWORDS = ("compute_entropy", "compute_aux_loss")
_GRPO_STATE = ("_metrics", "_logs", "_tokenizer", "_dist", "model_wrapped", "num_generations",
               "num_generations_eval", "use_vllm", "reward_weights", "reward_func_names", "eos_token_ids", "ref_model",
               "generation_config", "vllm_generation", "chat_template_kwargs", "temperature", "top_p", "top_k",
               "min_p", "repetition_penalty", "beta", "epsilon_low", "epsilon_high", "mask_truncated_completions")

TOUCH_POINTS: tuple[TouchPoint, ...] = (
    # GRPO (MultiTurnGRPOTrainer, MultiTurnPPOTrainer)
    TouchPoint(GRPO, "_generate_and_score_completions", ("inputs",), "overridden: rollout, then TRL's scoring",
               exact=True),
    TouchPoint(GRPO, "_generate", ("prompts",), "overridden: answered from the played episodes (generate_result)",
               exact=True),
    TouchPoint(GRPO, "_calculate_rewards", ("inputs", "prompts", "completions", "completion_ids_list"),
               "overridden: records the per-function rewards on the step's RolloutBatch", exact=True),
    TouchPoint(GRPO, "_compute_loss", ("model", "inputs"),
               "overridden by PPO: its whole loss (clipped surrogate + vf_coef * clipped value loss) from one forward "
               "of policy and critic", exact=True),
    TouchPoint(GRPO, "_generate_single_turn", ("prompt_ids", "images", "multimodal_fields", "num_generations"),
               "called per turn: one reply per episode (single_turn_replies)"),
    TouchPoint(GRPO, "_get_per_token_logps_and_entropies", _LOGPS, "called: reference and old log-probs",
               keywords=_LOGPS_KEYWORDS),
    TouchPoint("trl.trainer.grpo_trainer", "create_model_from_path", ("model_id", "architecture"),
               "swapped during __init__: the reference model is a copy of the policy object"),
    *(TouchPoint(GRPO, name, None, "read after __init__", instance=True) for name in _GRPO_STATE),
    # RLOO
    TouchPoint(RLOO, "_generate_and_score_completions", ("inputs",), "overridden: rollout and scoring",
               exact=True),
    TouchPoint(RLOO, "_calculate_rewards", ("inputs", "prompts", "completions", "completion_ids_list"),
               "called: TRL's reward functions on whole episodes"),
    TouchPoint(RLOO, "_compute_loss", ("model", "inputs"), "overridden: per-segment surrogate on env_mask",
               exact=True),
    TouchPoint(RLOO, "_generate_single_turn", ("prompt_ids", "images", "multimodal_fields"),
               "called per turn: one reply per episode (single_turn_replies)"),
    TouchPoint(RLOO, "_get_per_token_logps_and_entropies", _LOGPS, "called: old, reference and new log-probs",
               keywords=_LOGPS_KEYWORDS),
    TouchPoint("trl.trainer.rloo_trainer", "create_model_from_path", ("model_id", "architecture"),
               "swapped during __init__: the reference model is a copy of the policy object"),
    *(TouchPoint(RLOO, name, None, "read after __init__", instance=True)
      for name in (*_GRPO_STATE, "normalize_advantages", "pad_to_multiple_of", "aux_loss_enabled")),
    # SFT
    TouchPoint(SFT, "_prepare_dataset", ("dataset", "processing_class", "args", "packing", "formatting_func",
                                         "dataset_name"), "overridden: episodes tokenised by the rollout's builder",
               exact=True),
    # transformers' Trainer (PPO: its model is policy and critic in one module, `PolicyAndValueModel`)
    TouchPoint(TRAINER, "create_optimizer", ("model",),
               "overridden by PPO: the critic's parameters in groups of their own at critic_learning_rate",
               exact=True),
    TouchPoint(TRAINER, "_save", ("output_dir", "state_dict"),
               "overridden by PPO: the policy as TRL saves it, the critic in critic/ (the state dict of both, "
               "gathered by save_model under FSDP, DeepSpeed)", exact=True),
    TouchPoint(TRAINER, "_load_from_checkpoint", ("resume_from_checkpoint", "model"),
               "overridden by PPO: what _save wrote, into the policy and the critic (not under FSDP, whose own "
               "checkpoint covers both)", exact=True),
    TouchPoint("transformers.trainer", "TRAINING_ARGS_NAME", None, "read by PPO's _save: the args file's name"),
    # TRL helpers, called with these parameters by name
    TouchPoint("trl.models.utils", "unwrap_model_for_generation", ("model", "accelerator"),
               "called: the KV-cached episode generation (MultiTurnMixin._generation_model)",
               keywords=("gather_deepspeed3_params", "gradient_checkpointing_kwargs"), shared=True),
    TouchPoint("trl.models.utils", "disable_gradient_checkpointing", ("model", "gradient_checkpointing_kwargs"),
               "called: no-grad scoring (RLOO, PPO)", shared=True),
    TouchPoint("trl.trainer.utils", "use_adapter", ("model",), "called: reference log-probs of a PEFT policy",
               keywords=("adapter_name",), shared=True),
    TouchPoint("trl.trainer.utils", "pad", ("tensors",), "called: RLOO's episode tensors",
               keywords=("padding_value", "padding_side", "pad_to_multiple_of"), shared=True),
    TouchPoint("trl.trainer.utils", "disable_dropout_in_model", ("model",), "called: PPO's critic", shared=True),
    TouchPoint("trl.trainer.utils", "add_fused_lm_head", ("model",),
               "called by GRPO's __init__ on the policy; PPO's loss calls it with fused_lm_head=True and reads "
               "`log_probs` and `entropy`", keywords=("outputs",), shared=True),
    # vLLM colocated on CPU (vllm_cpu.py)
    TouchPoint("trl.generation.vllm_generation", "LLM", None, "swapped during __init__: the engine's dtype",
               shared=True, needs="vllm"),
)

OUTPUT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
               "ref_per_token_logps")
"""Keys of `GRPOTrainer._generate_and_score_completions`' output that MultiTurnGRPOTrainer and PPO read."""


def generate_result(*, prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields=None) -> tuple:
    """What `GRPOTrainer._generate` returns, built by name: TRL unpacks it positionally (`GENERATE_FIELDS`)."""
    named = {"prompt_ids_list": prompt_ids, "completion_ids_list": completion_ids, "tool_mask_list": tool_mask,
             "completions": completions, "sampling_per_token_logps_list": logprobs,
             "extra_fields": {} if extra_fields is None else extra_fields, "images": None, "tool_images": []}
    return tuple(named[field] for field in GENERATE_FIELDS)


def single_turn_replies(trainer, contexts: list[list[int]]):
    """`(completion_ids, logprobs | None)`: one reply per context (an episode's whole history) from the TRL parent's
    `_generate_single_turn`. GRPO's takes `num_generations` and returns log-probs too; RLOO's returns the completions
    alone and asks vLLM for `trainer.num_generations` replies per prompt, so that count is 1 while it runs."""
    from trl import RLOOTrainer

    if not isinstance(trainer, RLOOTrainer):
        return trainer._generate_single_turn(prompt_ids=contexts, images=None, multimodal_fields={}, num_generations=1)
    saved = trainer.num_generations, trainer.num_generations_eval
    trainer.num_generations = trainer.num_generations_eval = 1
    try:
        return trainer._generate_single_turn(prompt_ids=contexts, images=None, multimodal_fields={}), None
    finally:
        trainer.num_generations, trainer.num_generations_eval = saved


def check_trl_compat(trainer_cls: type) -> None:
    """Raise `TRLCompatibilityError` if the installed TRL differs from what `trainer_cls` relies on: the signatures
    of `TOUCH_POINTS` whose owner is among its bases (or whose module defines one), `_generate`'s tuple and
    `_compute_loss`'s `tool_mask` (GRPO). Cached per class."""
    problems = _class_problems(trainer_cls)
    if problems:
        raise TRLCompatibilityError(_message(problems))


def check_trl_attributes(trainer) -> None:
    """Raise `TRLCompatibilityError` if TRL's `__init__` did not set an attribute the trainers read."""
    bases = {_qualified(cls) for cls in type(trainer).__mro__}
    # TRL sets the generation config of the path it generates with: `vllm_generation` or `generation_config`.
    unused = "generation_config" if getattr(trainer, "use_vllm", False) else "vllm_generation"
    problems = [f"{_short(p.owner)} instances have no attribute {p.name!r} ({p.use})" for p in TOUCH_POINTS
                if p.instance and p.owner in bases and p.name != unused and not hasattr(trainer, p.name)]
    if problems:
        raise TRLCompatibilityError(_message(problems))


def touch_point_problems(points=TOUCH_POINTS) -> list[str]:
    """One line per touch point (not instance attributes) whose signature differs from the installed TRL's."""
    return [problem for point in points if not point.instance for problem in [_problem(point)] if problem]


@functools.cache
def _class_problems(trainer_cls: type) -> list[str]:
    bases = {_qualified(cls) for cls in trainer_cls.__mro__}
    modules = {name.split(":")[0] for name in bases}
    points = [p for p in TOUCH_POINTS if p.owner in bases or p.owner in modules or p.shared]
    problems = touch_point_problems(points)
    if GRPO in bases:
        problems += generate_tuple_problems()
    return problems


def generate_tuple_problems() -> list[str]:
    """Differences between `GENERATE_FIELDS` and TRL's unpacking of `_generate`, a `_compute_loss` that no longer
    reads `tool_mask`, and `OUTPUT_KEYS` missing from `_generate_and_score_completions`."""
    from trl import GRPOTrainer

    problems = []
    unpacked = _unpacked_names(GRPOTrainer._generate_and_score_completions, "_generate")
    if unpacked != GENERATE_FIELDS:
        problems.append(f"GRPOTrainer._generate_and_score_completions unpacks _generate() as {unpacked}, expected "
                        f"{GENERATE_FIELDS}")
    if '"tool_mask"' not in inspect.getsource(GRPOTrainer._compute_loss):
        problems.append('GRPOTrainer._compute_loss no longer reads inputs["tool_mask"] (the env_mask hook)')
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    missing = [key for key in OUTPUT_KEYS if f'"{key}"' not in source]
    if missing:
        problems.append(f"GRPOTrainer._generate_and_score_completions no longer outputs {missing}")
    return problems


def _unpacked_names(function, callee: str) -> tuple[str, ...] | None:
    """The names of a tuple assignment `(a, b, ...) = self.<callee>(...)` in `function`'s source, or None."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == callee
                and isinstance(node.targets[0], ast.Tuple)):
            return tuple(getattr(element, "id", "?") for element in node.targets[0].elts)
    return None


def _problem(point: TouchPoint) -> str | None:
    if point.needs is not None and importlib.util.find_spec(point.needs) is None:
        return None
    where = f"{_short(point.owner)}.{point.name}"
    try:
        owner = _resolve(point.owner)
    except ImportError as exc:
        return f"{point.owner} cannot be imported ({exc})"
    if not hasattr(owner, point.name):
        return f"{where} is gone ({point.use})"
    if point.parameters is None:
        return None
    params = [p for name, p in inspect.signature(getattr(owner, point.name)).parameters.items() if name != "self"]
    names = tuple(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    expected = point.parameters
    if point.exact:
        ok = names == expected
    else:
        rest = [p for p in params[len(expected):] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        ok = (names[:len(expected)] == expected and set(point.keywords) <= set(names)
              and all(p.default is not p.empty for p in rest if p.name not in point.keywords))
    if ok:
        return None
    wanted = f"{_signature(expected, more=not point.exact)}"
    if point.keywords:
        wanted += f" with keywords {list(point.keywords)}"
    return f"{where}{_signature(names)}: expected {wanted} ({point.use})"


def _message(problems: list[str]) -> str:
    import trl

    lines = "\n".join(f"  - {problem}" for problem in problems)
    return (f"trl-multiturn supports TRL {SUPPORTED_TRL}; the installed TRL {trl.__version__} differs in the private "
            f"API the trainers rely on (trl_multiturn/trainers/trl_compat.py):\n{lines}\n"
            f"Install a supported TRL (pip install 'trl==1.16.*').")


def _resolve(owner: str):
    module, _, cls = owner.partition(":")
    value = importlib.import_module(module)
    return getattr(value, cls) if cls else value


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _short(owner: str) -> str:
    return owner.rpartition(":")[2] or owner


def _signature(names, more: bool = False) -> str:
    return f"({', '.join([*names, '...'] if more else names)})"
