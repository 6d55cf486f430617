"""The boundary with TRL, transformers, accelerate and vLLM: every name the trainers use beyond their public API, in
one table, checked when a trainer is built and, against the package's source, by tests/trainers/test_trl_boundary.py.

The supported TRL releases are 1.14 through 1.16 (`SUPPORTED_TRL`; pyproject.toml declares the same range, and CI
runs the trainer tests on the oldest and the newest). What counts as public: the names the modules of
`PUBLIC_MODULES` export, and the trainer attributes of `TRAINER_PUBLIC`; tests/trl_boundary_scan.py finds every other
use in the source, and the test fails on one this table does not list.

The private names, and why each one is needed (the whole list: `PRIVATE_NAMES` is derived from the table):

| name | where | why |
| --- | --- | --- |
| `_generate_and_score_completions` | overridden (RL) | TRL's one request for a generation batch: `MultiTurnStep` |
| `_get_per_token_logps_and_entropies` | overridden (RL) | TRL's loss reads its log-probs here: `Forwards.logps` |
| `_compute_loss` | overridden (RLOO, PPO) | their losses are not GRPO's (per-segment ratios; the critic) |
| `_generate_single_turn` | called | TRL's backends (vLLM, transformers' generate): one reply per episode |
| `_metrics`, `_logs` | appended to | TRL's metric and completion logs: its `log` reports ours by its names |
| `_prepare_dataset` | overridden (SFT) | episodes tokenised by the rollout's own token builder |
| `_attn_implementation` | read (a model config's) | packing refuses attention that cannot take its 4-D mask |
| `_save`, `_load_from_checkpoint` | overridden (PPO) | each backend's save and resume end here: critic/ too |

Beyond those, public-looking attributes TRL's `__init__` sets are read (`AFTER_INIT`, checked on every trainer
built), a few helpers of TRL's inner modules are called with the parameters listed, and three functions are swapped
for the length of one call: `create_model_from_path` (the reference model of a policy object: TRL reloads
`config._name_or_path`, which fails for a model built in memory and loads other weights for one changed after
loading), and vLLM's CPU engine (`vllm_cpu.py`). The reply cap (`generation_config.max_new_tokens`,
`vllm_generation.max_completion_length`) and RLOO's `num_generations` (and GRPO's before TRL 1.15) are set around
one generate call, since TRL's single-turn generation takes neither as an argument.

PPO builds the reference model of the KL in its reward itself where TRL builds none (TRL builds one for `beta != 0`
only: `ppo.MultiTurnPPOTrainer._reward_reference`, prepared as TRL prepares its own), and passes `num_generations=1`
through `GRPOConfig`'s "< 2" check (`ppo._GroupOfOne`): covered by tests/trainers/test_ppo.py.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass

import trl

SUPPORTED_TRL = ">=1.14,<1.17"
"""The TRL releases whose API matches `TOUCH_POINTS` (pyproject.toml declares the same range)."""


class TRLCompatibilityError(RuntimeError):
    """The installed TRL differs from the private API the trainers rely on."""


@dataclass(frozen=True)
class TouchPoint:
    """One private name of TRL or transformers that the trainers use.

    `owner` is a class ("module:Class") or a module ("module"); `parameters` the parameter names (without `self`)
    we rely on, in order. `exact`: the whole parameter list must match (we override the method, so TRL calls ours
    with its arguments); otherwise the listed names must come first, the `keywords` we pass by name must exist, and
    any further parameter needs a default (we call it) unless it is one of `optional` (passed where the release
    takes it). `parameters=None`: only the attribute's existence is
    checked (an instance attribute of the trainer when `instance` is set, read after TRL's `__init__`). A touch
    point applies to the trainers with its owner class among their bases or its owner module defining one of their
    bases; a `shared` one (a TRL helper) to all.

    `via`: the trainer attribute through which an attribute of another TRL object is reached
    (`vllm_generation` for `VLLMGeneration.max_completion_length`); `public_value`: the attribute holds an object of
    a public type (a tokenizer), whose own public attributes are no further touch points. The source scan
    (tests/trainers/test_trl_boundary.py) requires every use it finds to be listed by `reached`.
    """

    owner: str
    name: str
    parameters: tuple[str, ...] | None
    use: str
    keywords: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    exact: bool = False
    instance: bool = False
    shared: bool = False
    needs: str | None = None  # an optional package without which the touch point is not used
    via: str | None = None
    public_value: bool = False

    @property
    def reached(self) -> str:
        """How the code names it: `name`, or `via.name`."""
        return f"{self.via}.{self.name}" if self.via else self.name


GRPO = "trl.trainer.grpo_trainer:GRPOTrainer"
RLOO = "trl.trainer.rloo_trainer:RLOOTrainer"
SFT = "trl.trainer.sft_trainer:SFTTrainer"
TRAINER = "transformers.trainer:Trainer"
VLLM_GENERATION = "trl.generation.vllm_generation:VLLMGeneration"
AFTER_INIT = "read after __init__"
"""The `use` of the trainer attributes that `check_trl_attributes` finds on every trainer TRL's `__init__` built."""
_GRPO_STATE = ("num_generations", "num_generations_eval", "use_vllm",
               "reward_funcs", "reward_weights", "reward_func_names", "ref_model",
               "generation_config", "vllm_generation", "chat_template_kwargs", "temperature", "top_p", "top_k",
               "min_p", "repetition_penalty", "beta", "epsilon_low", "epsilon_high")
_RLOO_STATE = ("normalize_advantages", "aux_loss_enabled", "router_aux_loss_coef")

LIBRARIES = ("trl", "transformers", "accelerate", "vllm")
"""The libraries whose touch points this table holds."""

PUBLIC_MODULES = ("trl", "transformers", "accelerate", "accelerate.utils", "vllm")
"""The modules whose exported names are the libraries' public API: a name imported from any other of their modules
is a touch point (accelerate documents its helpers under `accelerate.utils`)."""

TRAINER_PUBLIC = ("args", "model", "model_wrapped", "accelerator", "state", "control", "processing_class",
                  "train_dataset", "eval_dataset", "data_collator", "optimizer", "lr_scheduler", "callback_handler",
                  "is_deepspeed_enabled", "is_fsdp_enabled", "is_in_train")
"""`transformers.Trainer`'s documented instance attributes (its "Important attributes", the `__init__` arguments it
keeps, the objects it hands its callbacks). With the public methods of the trainer classes, reading these is no
touch point."""

TOUCH_POINTS: tuple[TouchPoint, ...] = (
    # The private names (`PRIVATE_NAMES`): the step, its forwards, the losses, generation, logs, saving.
    TouchPoint(GRPO, "_generate_and_score_completions", ("inputs",), "overridden: MultiTurnStep answers it",
               exact=True),
    TouchPoint(RLOO, "_generate_and_score_completions", ("inputs",), "overridden: MultiTurnStep answers it",
               exact=True),
    TouchPoint(GRPO, "_get_per_token_logps_and_entropies", None, "overridden: forwards.Forwards.logps for every "
               "forward, TRL's loss's included (which passes model, input_ids, attention_mask, logits_to_keep, "
               "compute_entropy, compute_aux_loss and multimodal keywords)"),
    TouchPoint(RLOO, "_get_per_token_logps_and_entropies", None, "overridden: forwards.Forwards.logps"),
    TouchPoint(GRPO, "_compute_loss", ("model", "inputs"), "overridden by PPO: clipped surrogate + vf_coef * clipped "
               "value loss from one forward of policy and critic", exact=True),
    TouchPoint(RLOO, "_compute_loss", ("model", "inputs"), "overridden: per-segment surrogate on the trained mask",
               exact=True),
    TouchPoint(GRPO, "_generate_single_turn", ("prompt_ids", "images", "multimodal_fields"),
               "called per turn: one reply per episode (single_turn_replies)", optional=("num_generations",)),
    TouchPoint(RLOO, "_generate_single_turn", ("prompt_ids", "images", "multimodal_fields"),
               "called per turn: one reply per episode (single_turn_replies)"),
    TouchPoint(GRPO, "_metrics", None, AFTER_INIT, instance=True),
    TouchPoint(GRPO, "_logs", None, AFTER_INIT, instance=True),
    TouchPoint(RLOO, "_metrics", None, AFTER_INIT, instance=True),
    TouchPoint(RLOO, "_logs", None, AFTER_INIT, instance=True),
    TouchPoint(SFT, "_prepare_dataset", ("dataset", "processing_class", "args", "packing", "formatting_func",
                                         "dataset_name"), "overridden: episodes tokenised by the rollout's builder",
               exact=True),
    TouchPoint(TRAINER, "_save", ("output_dir", "state_dict"),
               "overridden by PPO: the policy as TRL saves it, the critic in critic/", exact=True),
    TouchPoint(TRAINER, "_load_from_checkpoint", ("resume_from_checkpoint", "model"),
               "overridden by PPO: what _save wrote, into the policy and the critic", exact=True),
    # Attributes TRL's __init__ sets, read after it (public-looking, but not transformers' documented API).
    *(TouchPoint(GRPO, name, None, AFTER_INIT, instance=True) for name in _GRPO_STATE),
    *(TouchPoint(RLOO, name, None, AFTER_INIT, instance=True) for name in (*_GRPO_STATE, *_RLOO_STATE)),
    TouchPoint(GRPO, "beta", None, "set by PPO: non-zero while TRL's __init__ runs, so that TRL builds a reference "
               "model for the KL penalty in the rewards", instance=True),
    TouchPoint(GRPO, "ref_model", None, "set by PPO where TRL built none (beta == 0): the reference of the KL in "
               "PPO's reward (MultiTurnPPOTrainer._reward_reference)", instance=True),
    TouchPoint(GRPO, "use_transformers_continuous_batching", None, "read: TRL's own generation runs with it",
               instance=True),
    TouchPoint(RLOO, "num_generations", None, "set while one turn's replies are generated: TRL's vLLM call asks "
               "for num_generations replies per prompt (single_turn_replies)", instance=True),
    TouchPoint(RLOO, "num_generations_eval", None, "set while one turn's replies are generated (as num_generations)",
               instance=True),
    TouchPoint(VLLM_GENERATION, "max_completion_length", None,
               "set around one generate call: a reply capped at the live episodes' budget (capped_replies)",
               instance=True, via="vllm_generation"),
    TouchPoint("transformers.generation.configuration_utils:GenerationConfig", "max_new_tokens", None,
               "set around one generate call: a reply capped at the live episodes' budget (capped_replies)",
               instance=True, via="generation_config"),
    TouchPoint(TRAINER, "current_gradient_accumulation_steps", None,
               "read by PPO: its loss is divided by the step's number of accumulated micro-batches, as GRPO's is",
               instance=True),
    TouchPoint(TRAINER, "place_model_on_device", None,
               "read by PPO: the critic goes to the device when transformers puts the policy there", instance=True),
    TouchPoint(TRAINER, "hub_model_id", None, "read: the model card's Hub id", instance=True),
    TouchPoint("transformers.configuration_utils:PreTrainedConfig", "_attn_implementation", None,
               "read: packing takes the attention implementations that honour a 4-D mask (packing_refusal)",
               instance=True, shared=True),
    # Functions swapped while TRL's __init__ runs.
    TouchPoint("trl.trainer.grpo_trainer", "create_model_from_path", ("model_id",),
               "swapped during __init__: the reference model is a copy of the policy object"),
    TouchPoint("trl.trainer.rloo_trainer", "create_model_from_path", ("model_id",),
               "swapped during __init__: the reference model is a copy of the policy object"),
    # Names of inner modules, called with these parameters by name.
    TouchPoint("transformers.trainer", "TRAINING_ARGS_NAME", None, "read by PPO's _save: the args file's name"),
    TouchPoint("transformers.trainer", "TRAINER_STATE_NAME", None, "read: the checkpoint's state file name",
               shared=True),
    TouchPoint("trl.models.utils", "unwrap_model_for_generation", ("model", "accelerator"),
               "called: the KV-cached episode generation (GenerationBackend.rollout)",
               keywords=("gather_deepspeed3_params",), shared=True),
    TouchPoint("trl.models.utils", "disable_gradient_checkpointing", ("model", "gradient_checkpointing_kwargs"),
               "called: the step's no-grad forwards and the episode generation", shared=True),
    TouchPoint("trl.trainer.utils", "use_adapter", ("model",), "called: reference log-probs of a PEFT policy",
               keywords=("adapter_name",), shared=True),
    TouchPoint("trl.trainer.utils", "pad", ("tensors",), "called: the step's padded rows",
               keywords=("padding_value", "padding_side", "pad_to_multiple_of"), shared=True),
    TouchPoint("trl.trainer.utils", "nanstd", ("tensor",), "called: the step's reward metrics", shared=True),
    TouchPoint("trl.trainer.utils", "disable_dropout_in_model", ("model",), "called: PPO's critic and reference, "
               "a distillation teacher", shared=True),
    TouchPoint("trl.trainer.utils", "create_model_from_path", ("model_id",), "called: PPO's reference and a "
               "distillation teacher from a path", shared=True),
    TouchPoint("trl.models.utils", "prepare_deepspeed", ("model", "accelerator"), "called: PPO's reference and a "
               "distillation teacher under DeepSpeed, as TRL prepares its own", shared=True),
    TouchPoint("trl.models.utils", "prepare_fsdp", ("model", "accelerator"), "called: PPO's reference and a "
               "distillation teacher under FSDP, as TRL prepares its own", shared=True),
    TouchPoint("trl.data_utils", "get_dataset_column_names", ("dataset",), "called: the SFT dataset's columns",
               shared=True),
    TouchPoint("trl.chat_template_utils", "get_training_chat_template", ("processing_class",),
               "called: use_training_chat_template", shared=True),
    TouchPoint("trl.chat_template_utils", "parse_response", ("tokenizer", "ids"),
               "called: the tool_calls action parser reads a reply's tool calls", keywords=("prefix",), shared=True),
    TouchPoint("trl.chat_template_utils", "add_response_schema", ("processing_class",),
               "called: the tool_calls action parser", shared=True),
    TouchPoint("trl.chat_template_utils", "supports_tool_calling", ("processing_class",),
               "called: the tool_calls action parser", shared=True),
    TouchPoint("transformers.utils", "is_torch_bf16_gpu_available", (), "called: bf16 where supported",
               shared=True),
    TouchPoint("transformers.utils", "is_torch_xla_available", (), "called: bf16 where supported", shared=True),
    TouchPoint("transformers.utils", "get_json_schema", ("func",), "called: a tool's JSON schema (envs/tools.py)",
               shared=True),
    TouchPoint("transformers.cache_utils", "LinearAttentionCacheLayerMixin", None,
               "read: which of a hybrid model's cache layers hold a convolution or recurrent state, so its rows "
               "fork those states (packing_states.forks_states)", shared=True),
    TouchPoint("transformers.modeling_layers", "GenericForTokenClassification", None,
               "subclassed: a tiny critic for a family transformers gives no token-classification class "
               "(model_families.build_critic)", shared=True),
    *(TouchPoint("transformers.generation.logits_process", name, None,
                 "built: the sampling of the episode-history cache (rollout/generation.py), as generate does",
                 shared=True)
      for name in ("LogitsProcessorList", "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper")),
    # vLLM colocated on CPU (vllm_cpu.py)
    TouchPoint("trl.generation.vllm_generation", "LLM", None, "swapped during __init__: the engine's dtype",
               shared=True, needs="vllm"),
    TouchPoint("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm", None,
               "swapped during __init__: vLLM's CPU linear layers keep computing with the live weight TRL syncs",
               shared=True, needs="vllm"),
    TouchPoint("vllm.platforms", "current_platform", None, "read: whether vLLM runs on CPU", shared=True,
               needs="vllm"),
)

PRIVATE_NAMES = tuple(sorted({p.name for p in TOUCH_POINTS if p.name.startswith("_")}))
"""The distinct private names of the libraries the trainers use (the table in this module's docstring)."""


def single_turn_replies(trainer, contexts: list[list[int]]):
    """`(completion_ids, logprobs | None)`: one reply per context (an episode's whole history) from the TRL parent's
    `_generate_single_turn`. GRPO's (from TRL 1.15) takes `num_generations`; RLOO's, and GRPO's before, ask vLLM for
    `trainer.num_generations` replies per prompt, so that count is 1 while it runs. RLOO's returns the completions
    alone."""
    generate = trainer._generate_single_turn
    if _takes_num_generations(type(trainer)):
        out = generate(prompt_ids=contexts, images=None, multimodal_fields={}, num_generations=1)
    else:
        saved = trainer.num_generations, trainer.num_generations_eval
        trainer.num_generations = trainer.num_generations_eval = 1
        try:
            out = generate(prompt_ids=contexts, images=None, multimodal_fields={})
        finally:
            trainer.num_generations, trainer.num_generations_eval = saved
    return out if isinstance(out, tuple) else (out, None)


@contextmanager
def capped_replies(trainer, max_new_tokens: int):
    """TRL's per-reply cap lowered to `max_new_tokens` (at least 1, never above TRL's own) around one generate call,
    then restored: `vllm_generation.max_completion_length` on the vLLM paths, `generation_config.max_new_tokens` on
    transformers' (TRL's single-turn generation takes no cap as an argument)."""
    old = (trainer.vllm_generation.max_completion_length if trainer.use_vllm
           else trainer.generation_config.max_new_tokens)
    set_reply_cap(trainer, max(1, min(old, max_new_tokens)))
    try:
        yield
    finally:
        set_reply_cap(trainer, old)


def set_reply_cap(trainer, tokens: int) -> None:
    """Set the reply cap TRL's single-turn generation reads (`capped_replies`)."""
    if trainer.use_vllm:
        trainer.vllm_generation.max_completion_length = tokens
    else:
        trainer.generation_config.max_new_tokens = tokens


@functools.cache
def _takes_num_generations(trainer_cls: type) -> bool:
    """Whether `trainer_cls._generate_single_turn` takes `num_generations` (GRPO's from TRL 1.15): read once per class,
    not per turn."""
    return "num_generations" in inspect.signature(trainer_cls._generate_single_turn).parameters


def check_trl_compat(trainer_cls: type) -> None:
    """Raise `TRLCompatibilityError` if the installed TRL differs from what `trainer_cls` relies on: the existence and
    signatures of the `TOUCH_POINTS` whose owner is among its bases (or whose module defines one), and the shared
    ones. Cached per class."""
    problems = _class_problems(trainer_cls)
    if problems:
        raise TRLCompatibilityError(_message(problems))


def check_trl_attributes(trainer) -> None:
    """Raise `TRLCompatibilityError` if TRL's `__init__` did not set an attribute the trainers read."""
    bases = {_qualified(cls) for cls in type(trainer).__mro__}
    # TRL sets the generation config of the path it generates with: `vllm_generation` or `generation_config`.
    unused = "generation_config" if getattr(trainer, "use_vllm", False) else "vllm_generation"
    problems = [f"{_short(p.owner)} instances have no attribute {p.name!r} ({p.use})" for p in TOUCH_POINTS
                if p.use == AFTER_INIT and p.owner in bases and p.name != unused and not hasattr(trainer, p.name)]
    if problems:
        raise TRLCompatibilityError(_message(problems))


def touch_point_problems(points=TOUCH_POINTS) -> list[str]:
    """One line per touch point that the installed libraries lack or whose signature differs (an instance attribute
    must be assigned as `self.<name>` in the source of its owner class or one of that library's bases)."""
    return [problem for point in points for problem in [_problem(point)] if problem]


@functools.cache
def _class_problems(trainer_cls: type) -> list[str]:
    bases = {_qualified(cls) for cls in trainer_cls.__mro__}
    modules = {name.split(":")[0] for name in bases}
    points = [p for p in TOUCH_POINTS if p.owner in bases or p.owner in modules or p.shared]
    return touch_point_problems(points)


def _problem(point: TouchPoint) -> str | None:
    if point.needs is not None and importlib.util.find_spec(point.needs) is None:
        return None
    where = f"{_short(point.owner)}.{point.name}"
    try:
        owner = _resolve(point.owner)
    except ImportError as exc:
        return f"{point.owner} cannot be imported ({exc})"
    if point.instance:
        return None if point.name in _assigned_attributes(owner) else f"{where} is gone ({point.use})"
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
              and all(p.default is not p.empty for p in rest if p.name not in (*point.keywords, *point.optional)))
    if ok:
        return None
    wanted = f"{_signature(expected, more=not point.exact)}"
    if point.keywords:
        wanted += f" with keywords {list(point.keywords)}"
    return f"{where}{_signature(names)}: expected {wanted} ({point.use})"


@functools.cache
def _assigned_attributes(cls: type) -> frozenset[str]:
    """The names `cls` and its bases from the libraries define, or assign as `self.<name>` in their source."""
    names = set(dir(cls))
    for base in cls.__mro__:
        if base.__module__.split(".")[0] in LIBRARIES:
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
            names.update(node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                         and isinstance(node.ctx, ast.Store) and getattr(node.value, "id", None) == "self")
    return frozenset(names)


def _message(problems: list[str]) -> str:
    lines = "\n".join(f"  - {problem}" for problem in problems)
    return (f"trl-multiturn supports TRL {SUPPORTED_TRL}; the installed TRL {trl.__version__} differs in the private "
            f"API the trainers rely on (trl_multiturn/trainers/trl_compat.py):\n{lines}\n"
            f"Install a supported TRL (pip install 'trl{SUPPORTED_TRL}').")


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
