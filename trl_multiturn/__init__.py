"""trl-multiturn: multi-turn agentic RL (GRPO, RLOO, PPO, SFT, DAgger) on top of Hugging Face TRL."""

from .lazy import lazy_getattr
from .quiet import filter_known_warnings

__version__ = "0.1.0"

_PUBLIC = {
    "Environment": ".envs.base",
    "StepResult": ".envs.base",
    "EpisodeRunner": ".rollout.runner",
    "Episode": ".rollout.episode",
    "EpisodeRules": ".rollout.rules",
    "MultiTurnGRPOTrainer": ".trainers.grpo",
    "MultiTurnGRPOConfig": ".trainers.grpo",
    "MultiTurnRLOOTrainer": ".trainers.rloo",
    "MultiTurnRLOOConfig": ".trainers.rloo",
    "MultiTurnPPOTrainer": ".trainers.ppo",
    "MultiTurnPPOConfig": ".trainers.ppo",
    "MultiTurnSFTTrainer": ".trainers.sft",
    "MultiTurnSFTConfig": ".trainers.sft",
    "MultiTurnDAggerTrainer": ".trainers.dagger",
    "MultiTurnDAggerConfig": ".trainers.dagger",
}

__all__ = list(_PUBLIC)

filter_known_warnings()

# Lazy, so that `import trl_multiturn` stays cheap and environments work without importing TRL.
__getattr__ = lazy_getattr(__name__, _PUBLIC)
