"""trl-multiturn: multi-turn agentic RL (GRPO, RLOO, PPO, SFT) on top of Hugging Face TRL."""

from importlib import import_module

__version__ = "0.1.0"

_PUBLIC = {
    "Environment": ".envs.base",
    "StepResult": ".envs.base",
    "EpisodeRunner": ".rollout.runner",
    "MultiTurnRolloutCollator": ".rollout.runner",  # deprecated name of EpisodeRunner
    "Episode": ".rollout.episode",
    "MultiTurnGRPOTrainer": ".trainers.grpo",
    "MultiTurnGRPOConfig": ".trainers.grpo",
    "MultiTurnRLOOTrainer": ".trainers.rloo",
    "MultiTurnRLOOConfig": ".trainers.rloo",
    "MultiTurnPPOTrainer": ".trainers.ppo",
    "MultiTurnPPOConfig": ".trainers.ppo",
    "MultiTurnSFTTrainer": ".trainers.sft",
    "MultiTurnSFTConfig": ".trainers.sft",
}

__all__ = list(_PUBLIC)


def __getattr__(name):
    # Lazy, so that `import trl_multiturn` stays cheap and environments work without importing TRL.
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
