"""Primitives with no import beyond the standard library: the clock, Redis key building, hashing,
the bounded cache and the background worker thread.

May import: nothing of the project and no third-party package (a test holds it to the standard
library). Everything else may import it.
"""
