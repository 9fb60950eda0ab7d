"""Privacy accounting: exact randomness, guarantees as data, the budget ledger, and the
publication boundary (what a release folder may carry).
"""
