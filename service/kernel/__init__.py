"""The shared kernel every room stands on: the settings, the v1 wire contract (``schemas``), the
check that a value can be stored (``storable``), the clock, hashing, redaction of free text, the
token bucket of every rate limit, the check that Redis will not drop queued tasks, and the
judge queue's broker as seen from outside Celery (``broker``).

May import: nothing of the project. Everything else may import it.
"""
