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
