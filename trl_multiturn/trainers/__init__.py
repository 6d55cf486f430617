"""The multi-turn trainers, one trainer and its config per module, as TRL does."""

from ..lazy import lazy_getattr

_MODULES = {
    "MultiTurnGRPOTrainer": ".grpo", "MultiTurnGRPOConfig": ".grpo",
    "MultiTurnRLOOTrainer": ".rloo", "MultiTurnRLOOConfig": ".rloo",
    "MultiTurnPPOTrainer": ".ppo", "MultiTurnPPOConfig": ".ppo",
    "MultiTurnSFTTrainer": ".sft", "MultiTurnSFTConfig": ".sft",
    "MultiTurnDAggerTrainer": ".dagger", "MultiTurnDAggerConfig": ".dagger",
}
__all__ = list(_MODULES)

# Lazy, so that importing one trainer does not import the others (PPO's critic, SFT's dataset code).
__getattr__ = lazy_getattr(__name__, _MODULES)
