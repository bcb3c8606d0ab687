"""The names of the judge queues, known to the API that fills them, the workers that drain them
and the scrape that reports their depth."""

from __future__ import annotations


def urgent_queue(queue: str) -> str:
    """The queue of gold events and events whose signals look bad; workers consume it too."""
    return f"{queue}.urgent"


def gathering_list(queue: str) -> str:
    """Where the API processes sharing a Redis broker gather small sends for ``queue`` into
    slices: a list of event keys, not a queue (no worker consumes it)."""
    return f"{queue}.gathering"


def gathering_since(queue: str) -> str:
    """When the oldest event of ``gathering_list(queue)`` arrived (ms, the broker's clock)."""
    return f"{queue}.gathering.since"
