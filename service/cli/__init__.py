"""The ``retrieval-monitor`` command line: one package for every command (``main`` builds the
parser; each command family has a module of its own).

May import any room of ``service``; never ``workers`` (the worker runs as a subprocess).
"""
