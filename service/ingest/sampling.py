"""Which events the judge sees: a deterministic sample by a hash of the event id.

Each event id maps to one fixed point ``u`` in [0, 1); an event is sampled when ``u < rate``. The
point does not depend on the rate, so every event sampled at 10 % is also sampled at 50 %: raising
a rate only adds events, and two replicas (or a re-run) always agree. Gold events are always
judged: they are the instrument the judge is checked against.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Reason = Literal["gold", "sampled", "unsampled"]

_SCALE = float(2**64)


def sample_point(event_id: str) -> float:
    """The event's fixed point in [0, 1), uniform over ids."""
    digest = hashlib.sha256(event_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def keep_point(event_id: str) -> float:
    """A second fixed point in [0, 1), independent of ``sample_point`` (other bits of the same
    hash): which of the events sampling left out keep their texts (``RM_KEEP_TEXTS_SHARE``)."""
    digest = hashlib.sha256(event_id.encode()).digest()
    return int.from_bytes(digest[8:16], "big") / _SCALE


def rate_for(app: str, retriever: str, default: float, rates: Mapping[str, float]) -> float:
    """The configured rate of an (app, retriever): ``app/retriever``, then ``app``, then default."""
    for key in (f"{app}/{retriever}", app):
        if key in rates:
            return min(max(rates[key], 0.0), 1.0)
    return min(max(default, 0.0), 1.0)


@dataclass(frozen=True)
class Decision:
    judge: bool
    reason: Reason
    rate: float


def decide(
    event_id: str,
    app: str,
    retriever: str,
    is_gold: bool,
    default: float,
    rates: Mapping[str, float],
) -> Decision:
    rate = rate_for(app, retriever, default, rates)
    if is_gold:
        return Decision(True, "gold", rate)
    if sample_point(event_id) < rate:
        return Decision(True, "sampled", rate)
    return Decision(False, "unsampled", rate)
