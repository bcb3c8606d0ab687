"""The names of the judge queues, known to the API that fills them, the workers that drain them
and the scrape that reports their depth."""

from __future__ import annotations


def urgent_queue(queue: str) -> str:
    """The queue of gold events and events whose signals look bad; workers consume it too."""
    return f"{queue}.urgent"
