"""Credit assignment: reward modes and the registry of advantage estimators."""

from .estimators import ESTIMATORS, CreditBatch, discounted_returns, get_estimator, register
from .rewards import REWARD_MODES, shape_turn_rewards
from .tokens import turn_to_token_advantages

__all__ = [
    "ESTIMATORS",
    "REWARD_MODES",
    "CreditBatch",
    "discounted_returns",
    "get_estimator",
    "register",
    "shape_turn_rewards",
    "turn_to_token_advantages",
]
