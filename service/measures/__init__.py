"""Retrieval measures: the pure formulas of one judged retrieval (and of many at once).

May import: nothing from the project (plain arrays in, numbers out).
"""
