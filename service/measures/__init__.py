"""Retrieval measures: the pure formulas of one judged retrieval (and of many at once), and the
catalogue that declares each measure once (name, titles, range, source, buckets, analysis flags).

May import: nothing from the project (plain arrays in, numbers out); the formulas read only the
catalogue's names.
"""
