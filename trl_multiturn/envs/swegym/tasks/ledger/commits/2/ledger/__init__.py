from .account import Account, InsufficientFunds
from .transfer import Entry, Ledger

__all__ = ["Account", "Entry", "InsufficientFunds", "Ledger"]
