"""The multi-turn trainers, one trainer and its config per module, as TRL does."""

from importlib import import_module

_MODULES = {
    "MultiTurnGRPOTrainer": ".grpo", "MultiTurnGRPOConfig": ".grpo",
    "MultiTurnRLOOTrainer": ".rloo", "MultiTurnRLOOConfig": ".rloo",
    "MultiTurnPPOTrainer": ".ppo", "MultiTurnPPOConfig": ".ppo",
    "MultiTurnSFTTrainer": ".sft", "MultiTurnSFTConfig": ".sft",
}
__all__ = list(_MODULES)


def __getattr__(name):
    if name in _MODULES:
        return getattr(import_module(_MODULES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
