"""Every touch point of TRL, transformers, accelerate and vLLM in trl_multiturn's source is in
`trl_compat.TOUCH_POINTS`, and every entry there matches the installed libraries: a new touch point cannot slip in
unlisted (tests/trl_boundary_scan.py says what counts as one)."""

import ast
import functools
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest
import transformers
from trl import GRPOTrainer, RLOOTrainer, SFTTrainer
from trl_boundary_scan import Use, read_sources, scan, trainer_attributes

import trl_multiturn
from trl_multiturn import MultiTurnGRPOTrainer, MultiTurnPPOTrainer, MultiTurnRLOOTrainer, MultiTurnSFTTrainer
from trl_multiturn.trainers.trl_compat import PUBLIC_MODULES, TOUCH_POINTS, TRAINER_PUBLIC, touch_point_problems

PACKAGE = Path(trl_multiturn.__file__).parent
TRL_TRAINERS = (GRPOTrainer, RLOOTrainer, SFTTrainer)


@functools.cache
def _is_public(module: str, name: str) -> bool:
    try:
        imported = importlib.import_module(module)
    except ImportError:  # an optional library (vLLM) that is not installed: nothing counts as its public API
        return False
    return name in getattr(imported, "__all__", ()) or hasattr(imported, name)


@functools.cache
def _trainer_public() -> frozenset[str]:
    """The trainers' public API: TRAINER_PUBLIC and the public names of the classes themselves."""
    classes = (transformers.Trainer, *TRL_TRAINERS)
    return frozenset(TRAINER_PUBLIC) | {name for cls in classes for name in vars(cls) if not name.startswith("_")} | {
        name for name in dir(transformers.Trainer) if not name.startswith("_")}


@functools.cache
def _trainer_names() -> frozenset[str]:
    return frozenset(trainer_attributes(TRL_TRAINERS))


@functools.cache
def _sources() -> dict:
    return read_sources(PACKAGE)


def _scan(added: dict[str, str] | None = None) -> list[Use]:
    """The package's touch points, with `added` (path -> source) modules added to it."""
    sources = {**_sources(), **{path: ast.parse(source) for path, source in (added or {}).items()}}
    return scan(sources, _trainer_names(), _trainer_public(), PUBLIC_MODULES, _is_public)


WRITES = ("set", "swapped", "extended")
"""How a listed touch point's `use` begins when the code assigns it."""


def unlisted(uses: list[Use], points=TOUCH_POINTS) -> list[str]:
    """The uses `points` does not list, one line each (with the file)."""
    by_module = {(p.owner, p.name): p for p in points if ":" not in p.owner}
    reached = {}
    for p in points:
        reached.setdefault(p.reached, []).append(p)
    missing = []
    for use in uses:
        if use.kind in ("import", "module"):
            point = (any(p.owner == use.module for p in points) if use.name == "*"
                     else by_module.get((use.module, use.name)))
        else:
            first = use.name.partition(".")[0]
            candidates = reached.get(use.name) or [p for name, ps in reached.items()
                                                   if name.startswith(use.name + ".") for p in ps] or [
                p for p in reached.get(first, []) if p.public_value and use.name != first]
            writes = [p for p in candidates if p.use.startswith(WRITES)]
            point = (writes if use.assigned and writes else candidates or [None])[0]
        if not point:
            missing.append(f"{use.kind} {use.module + ':' if use.module else ''}{use.name} ({use.where})")
        elif use.assigned and point is not True and not point.use.startswith(WRITES):
            missing.append(f"{use.kind} {use.name} is assigned but listed as {point.use!r} ({use.where})")
    return missing


def test_every_touch_point_in_the_source_is_listed():
    uses = _scan()
    assert len(uses) > 50  # the scan sees the trainers' many uses (a scan that finds nothing proves nothing)
    assert unlisted(uses) == []


def test_every_listed_touch_point_matches_the_installed_libraries():
    assert touch_point_problems() == []


def test_every_listed_touch_point_is_used():
    """A touch point no longer used leaves the table with its use (no stale rows)."""
    uses = _scan()
    used_modules = {(u.module, u.name) for u in uses if u.kind in ("import", "module")}
    passed_whole = {u.module for u in uses if u.kind == "module" and u.name == "*"}
    used_names = {u.name for u in uses if u.kind in ("private", "state")}
    overridden = _overridden()
    stale = [f"{p.owner}.{p.name}" for p in TOUCH_POINTS
             if (p.owner, p.name) not in used_modules and p.owner not in passed_whole and p.reached not in used_names
             and not any(name.startswith(p.reached + ".") for name in used_names)
             and (p.owner, p.name) not in overridden]
    assert stale == []


def _overridden() -> set[tuple[str, str]]:
    """(library class, name) of each method or attribute a trl_multiturn class overrides."""
    found = set()
    for cls in (MultiTurnGRPOTrainer, MultiTurnRLOOTrainer, MultiTurnPPOTrainer, MultiTurnSFTTrainer,
                MultiTurnSFTTrainer.__init__.__globals__["MultiTurnSFTConfig"]):
        for ours in cls.__mro__:
            if not ours.__module__.startswith("trl_multiturn"):
                continue
            for name in vars(ours):
                parents = [base for base in cls.__mro__ if not base.__module__.startswith("trl_multiturn")
                           and name in vars(base)]
                if parents and not name.startswith("__"):
                    found.add((f"{parents[0].__module__}:{parents[0].__qualname__}", name))
    return found


def test_every_overridden_private_method_is_listed():
    listed = {(p.owner, p.name) for p in TOUCH_POINTS}
    private = {(owner, name) for owner, name in _overridden() if name.startswith("_") and name != "_tag_names"}
    assert private and private - listed == set()


@pytest.mark.parametrize("snippet, expected", [
    # a private method of TRL's trainer, called
    ("class XTrainer:\n    def f(self):\n        return self._get_train_sampler()\n", "state _get_train_sampler"),
    # a public-looking attribute TRL's __init__ sets, read
    ("class XMixin:\n    def f(self):\n        return self.vllm_importance_sampling_correction\n",
     "state vllm_importance_sampling_correction"),
    # an attribute of a TRL object reached through the trainer
    ("def f(trainer):\n    trainer.vllm_generation.enable_sleep_mode = False\n",
     "state vllm_generation.enable_sleep_mode"),
    # a private module's name imported
    ("from trl.trainer.utils import selective_log_softmax\n", "import trl.trainer.utils:selective_log_softmax"),
    # a module attribute swapped
    ("import trl.trainer.grpo_trainer as g\ng.unwrap_model_for_generation = None\n",
     "module trl.trainer.grpo_trainer:unwrap_model_for_generation"),
    # a library module handed to a helper whole
    ("import trl.trainer.callbacks as c\nprint(c)\n", "module trl.trainer.callbacks:*"),
    # a private class attribute of a TRL class, also defined by us
    ("from trl import GRPOTrainer\nclass C:\n    _tag_names = GRPOTrainer._tag_names\n", "private _tag_names"),
    # a private attribute through getattr
    ("def f(model):\n    return getattr(model, '_hf_peft_config_loaded')\n", "private _hf_peft_config_loaded"),
])
def test_a_new_unlisted_touch_point_is_found(snippet, expected):
    """Each kind of touch point, added to the package, fails the check naming it."""
    missing = unlisted(_scan({"trl_multiturn/trainers/added.py": textwrap.dedent(snippet)}))
    assert [line.rpartition(" (")[0] for line in missing] == [expected]
    assert missing[0].endswith("(trl_multiturn/trainers/added.py)")


def test_a_swap_listed_as_a_read_is_refused():
    uses = [Use("module", "trl.generation.vllm_generation", "LLM", assigned=True, where="x.py")]
    points = [p for p in TOUCH_POINTS if p.name != "LLM"] + [
        type(TOUCH_POINTS[0])("trl.generation.vllm_generation", "LLM", None, "read: the engine")]
    assert unlisted(uses, points) == ["module LLM is assigned but listed as 'read: the engine' (x.py)"]


def test_the_state_the_scan_knows_comes_from_trl_source():
    """The scan reads TRL's own assignments, so an attribute set only in TRL's __init__ counts as TRL's."""
    names = trainer_attributes(TRL_TRAINERS)
    assert {"vllm_generation", "num_generations", "_metrics", "current_gradient_accumulation_steps"} <= names
    assert "vllm_generation" in inspect.getsource(GRPOTrainer.__init__)
    assert "episode_runner" not in names  # ours, not TRL's
