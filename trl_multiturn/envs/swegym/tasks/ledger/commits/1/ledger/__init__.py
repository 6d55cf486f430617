from .account import Account, InsufficientFunds

__all__ = ["Account", "InsufficientFunds"]
