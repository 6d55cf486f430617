"""Moving money between accounts, with a journal of completed transfers."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    source: str
    target: str
    amount: int


class Ledger:
    def __init__(self):
        self.journal = []

    def transfer(self, source, target, amount):
        """Move `amount` from `source` to `target`; on any error neither balance changes."""
        target.deposit(amount)
        source.withdraw(amount)
        self.journal.append(Entry(source.name, target.name, amount))

    def total_moved(self):
        return sum(entry.amount for entry in self.journal)
