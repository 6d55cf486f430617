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
