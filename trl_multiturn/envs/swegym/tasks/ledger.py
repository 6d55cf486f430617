from .source import Edit, TaskSource

ACCOUNT = '''\
"""Accounts holding an integer balance in cents."""


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, name, balance=0):
        self.name = name
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposits must be positive")
        self.balance += amount

    def withdraw(self, amount):
        if amount <= 0:
            raise ValueError("withdrawals must be positive")
        if amount > self.balance:
            raise InsufficientFunds(f"{self.name} has {self.balance}, cannot withdraw {amount}")
        self.balance -= amount

    def __repr__(self):
        return f"Account({self.name!r}, balance={self.balance})"
'''

TRANSFER = '''\
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
'''

INIT = '''\
from .account import Account, InsufficientFunds
from .transfer import Entry, Ledger

__all__ = ["Account", "Entry", "InsufficientFunds", "Ledger"]
'''

TESTS = '''\
import pytest

from ledger import Account, Entry, InsufficientFunds, Ledger


def test_deposit_and_withdraw():
    account = Account("ada", 100)
    account.deposit(50)
    account.withdraw(30)
    assert account.balance == 120


def test_overdraw_rejected():
    with pytest.raises(InsufficientFunds):
        Account("bo", 10).withdraw(11)


def test_transfer_moves_money():
    a, b, ledger = Account("a", 100), Account("b"), Ledger()
    ledger.transfer(a, b, 40)
    assert (a.balance, b.balance) == (60, 40)
    assert ledger.journal == [Entry("a", "b", 40)] and ledger.total_moved() == 40


def test_non_positive_amount_rejected():
    with pytest.raises(ValueError):
        Ledger().transfer(Account("a", 5), Account("b"), 0)
'''

SOURCE = TaskSource(
    name="ledger",
    summary="Accounts and a ledger of transfers between them.",
    problem_statement='''
A failed transfer still credits the target account

`Ledger.transfer` promises that on any error neither balance changes, but when the source cannot cover the
amount the target has already been credited, so money is created:

```python
>>> from ledger import Account, Ledger
>>> a, b = Account("a", 10), Account("b", 0)
>>> Ledger().transfer(a, b, 50)
InsufficientFunds: a has 10, cannot withdraw 50
>>> a.balance, b.balance
(10, 50)
```

Expected `(10, 0)` after the exception, and nothing added to the journal.
''',
    commits=(
        ("Add accounts", {"ledger/__init__.py": "from .account import Account, InsufficientFunds\n\n"
                          "__all__ = [\"Account\", \"InsufficientFunds\"]\n", "ledger/account.py": ACCOUNT}),
        ("Add transfers with a journal", {"ledger/__init__.py": INIT, "ledger/transfer.py": TRANSFER,
                                          "tests/test_ledger.py": TESTS}),
    ),
    fix=(Edit("ledger/transfer.py", '''        target.deposit(amount)
        source.withdraw(amount)
''', '''        source.withdraw(amount)
        target.deposit(amount)
'''),),
    tests=(Edit("tests/test_ledger.py", None, '''

def test_failed_transfer_changes_nothing():
    a, b, ledger = Account("a", 10), Account("b"), Ledger()
    with pytest.raises(InsufficientFunds):
        ledger.transfer(a, b, 50)
    assert (a.balance, b.balance) == (10, 0) and ledger.journal == []
'''),),
    fail_to_pass=("tests/test_ledger.py::test_failed_transfer_changes_nothing",),
    pass_to_pass=(
        "tests/test_ledger.py::test_deposit_and_withdraw",
        "tests/test_ledger.py::test_overdraw_rejected",
        "tests/test_ledger.py::test_transfer_moves_money",
        "tests/test_ledger.py::test_non_positive_amount_rejected",
    ),
    base_commit="e3dc0d0dff172081725b25ff07f685795a08e462",
)
