"""The private TRL API the trainers rely on (`trainers/trl_compat.py`) matches the installed TRL, and a change is
refused with a message naming the supported TRL versions."""


import pytest
import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from trl import GRPOTrainer, RLOOTrainer

from trl_multiturn import MultiTurnGRPOTrainer, MultiTurnPPOTrainer, MultiTurnRLOOTrainer, MultiTurnSFTTrainer
from trl_multiturn.trainers import trl_compat
from trl_multiturn.trainers.trl_compat import (
    PRIVATE_NAMES,
    SUPPORTED_TRL,
    TOUCH_POINTS,
    TRLCompatibilityError,
    check_trl_compat,
    touch_point_problems,
)


def test_the_installed_trl_is_a_supported_one_and_matches_every_touch_point():
    assert Version(trl.__version__) in SpecifierSet(SUPPORTED_TRL)
    assert touch_point_problems() == []
    for trainer_cls in (MultiTurnGRPOTrainer, MultiTurnRLOOTrainer, MultiTurnPPOTrainer, MultiTurnSFTTrainer):
        check_trl_compat(trainer_cls)
    # The table lists each private method that a trainer overrides, under the TRL or transformers class it
    # overrides.
    listed = {(p.owner, p.name) for p in TOUCH_POINTS}
    for cls in (MultiTurnGRPOTrainer, MultiTurnRLOOTrainer, MultiTurnPPOTrainer, MultiTurnSFTTrainer):
        for name in vars(cls):
            parents = [base for base in cls.__mro__ if not base.__module__.startswith("trl_multiturn")
                       and name in vars(base)]
            if name.startswith("_") and not name.startswith("__") and name != "_tag_names" and parents:
                assert (f"{parents[0].__module__}:{parents[0].__qualname__}", name) in listed, (cls, name)


def test_the_private_names_are_few_and_each_in_the_docstring_table():
    assert len(PRIVATE_NAMES) <= 10
    for name in PRIVATE_NAMES:
        assert f"`{name}`" in trl_compat.__doc__, name


def test_the_declared_trl_range_is_the_supported_one():
    from pathlib import Path

    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    declared = [d for d in pyproject["project"]["dependencies"] if d.startswith("trl")]
    assert declared == [f"trl{SUPPORTED_TRL}"]


def _message_of(trainer_cls):
    trl_compat._class_problems.cache_clear()
    try:
        with pytest.raises(TRLCompatibilityError) as info:
            check_trl_compat(trainer_cls)
    finally:
        trl_compat._class_problems.cache_clear()
    return str(info.value)


def test_a_changed_private_signature_is_refused_naming_the_supported_versions(monkeypatch):
    """TRL's development branch changed `_generate_single_turn`; such a TRL must fail at construction."""
    def _generate_single_turn(self, prompts, sampling_params):  # a hypothetical next release
        raise AssertionError("never called")

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", _generate_single_turn)
    message = _message_of(MultiTurnGRPOTrainer)
    assert f"supports TRL {SUPPORTED_TRL}" in message and trl.__version__ in message
    assert ("GRPOTrainer._generate_single_turn(prompts, sampling_params): expected (prompt_ids, images, "
            "multimodal_fields, ...)") in message
    assert f"pip install 'trl{SUPPORTED_TRL}'" in message
    check_trl_compat(MultiTurnRLOOTrainer)  # RLOO does not use GRPO's method


def test_an_added_required_parameter_a_removed_method_and_an_override_mismatch_are_each_named(monkeypatch):
    def with_required(self, prompt_ids, images, multimodal_fields, sampling):
        raise AssertionError("never called")

    def compute_loss(self, model, inputs, num_items_in_batch):
        raise AssertionError("never called")

    monkeypatch.setattr(RLOOTrainer, "_generate_single_turn", with_required)
    monkeypatch.setattr(RLOOTrainer, "_compute_loss", compute_loss)
    monkeypatch.delattr(RLOOTrainer, "_get_per_token_logps_and_entropies")
    message = _message_of(MultiTurnRLOOTrainer)
    assert "RLOOTrainer._generate_single_turn(prompt_ids, images, multimodal_fields, sampling)" in message
    assert "RLOOTrainer._compute_loss(model, inputs, num_items_in_batch): expected (model, inputs) (" in message
    assert "RLOOTrainer._get_per_token_logps_and_entropies is gone" in message
    assert message.count("\n  - ") == 3


def test_a_helper_without_a_keyword_we_pass_is_refused(monkeypatch):
    import trl.trainer.utils

    def pad(tensors, padding_value=0, pad_to_multiple_of=None, side="right"):
        raise AssertionError("never called")

    monkeypatch.setattr(trl.trainer.utils, "pad", pad)
    message = _message_of(MultiTurnSFTTrainer)  # shared helpers apply to every trainer
    assert ("pad(tensors, padding_value, pad_to_multiple_of, side): expected (tensors, ...) with keywords "
            "['padding_value', 'padding_side', 'pad_to_multiple_of']") in message


def test_missing_trainer_state_is_refused():
    class Bare(GRPOTrainer):
        def __init__(self):
            pass

    bare = Bare.__new__(Bare)
    bare.__dict__.update({name: None for name in ("_metrics", "_logs")})
    with pytest.raises(TRLCompatibilityError, match="GRPOTrainer instances have no attribute 'num_generations'"):
        trl_compat.check_trl_attributes(bare)


@pytest.mark.parametrize("use_vllm", [False, True])
def test_only_the_generation_config_of_the_path_in_use_is_required(use_vllm):
    """TRL sets `vllm_generation` with use_vllm=True and `generation_config` without: each path needs only its own."""
    class Bare(GRPOTrainer):
        def __init__(self):
            pass

    state = {name: None for name in ("_metrics", "_logs", *trl_compat._GRPO_STATE)} | {"use_vllm": use_vllm}
    needed, other = ("vllm_generation", "generation_config") if use_vllm else ("generation_config", "vllm_generation")
    bare = Bare.__new__(Bare)
    bare.__dict__.update({k: v for k, v in state.items() if k != other})
    trl_compat.check_trl_attributes(bare)  # the other path's config is not needed
    del bare.__dict__[needed]
    with pytest.raises(TRLCompatibilityError, match=f"no attribute '{needed}'"):
        trl_compat.check_trl_attributes(bare)
