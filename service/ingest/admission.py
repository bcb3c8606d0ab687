"""Whether a request may bring its events in now: the service's backlog and commit time
(``Backpressure``, 503) and the tenant's rate (a token bucket, 429). A refusal is counted."""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.ingest.backpressure import Backpressure
from service.ingest.counts import count_refused
from service.queue.ratelimit import TokenBucket
from service.wiring.runtime import Runtime


@dataclass(frozen=True)
class Refusal:
    """Why a request is turned away before anything is stored, and when to come back."""

    status_code: int  # 503 (the service is overloaded) or 429 (the tenant is over its rate)
    reason: str
    message: str
    retry_after_seconds: int


class Admission:
    """The admission decisions of one process; ``backpressure`` is shared with the ingestor,
    which records each commit's time in it."""

    def __init__(self, runtime: Runtime, backpressure: Backpressure) -> None:
        self.runtime = runtime
        self.backpressure = backpressure

    def admit(self, tenant: str, events: int) -> Refusal | None:
        """Refuse work the service cannot take now; None when the request may proceed. A
        refusal is counted."""
        refusal = self.refusal(tenant, events)
        if refusal is not None:
            count_refused(self.runtime.aggregates, tenant, refusal.reason, events)
        return refusal

    def admits_without_io(self) -> bool:
        """Whether ``refusal(..., refresh=False)`` decides with no query and no Redis call: the
        backlog count is cached and no tenant rate applies (its token bucket lives in Redis)."""
        return (
            self.runtime.settings.tenant_events_per_second <= 0
            and self.backpressure.decides_without_io()
        )

    def refusal(self, tenant: str, events: int, refresh: bool = True) -> Refusal | None:
        """Why the request should be turned away now, or None; counts nothing (``admit`` and
        ``count_refused`` do). ``refresh=False``: the backlog's cached count, see
        ``Backpressure``."""
        overload = self.backpressure.check(refresh)
        if overload is not None:
            return Refusal(503, overload.reason, overload.message, overload.retry_after_seconds)
        if self.runtime.settings.tenant_events_per_second > 0:
            decision = self._tenant_bucket(tenant).take(events)
            if not decision.allowed:
                return Refusal(
                    429,
                    "rate_limited",
                    f"tenant {tenant!r} is over {self.runtime.settings.tenant_events_per_second:g} "
                    "events per second",
                    max(1, math.ceil(decision.retry_after_seconds)),
                )
        return None

    def _tenant_bucket(self, tenant: str) -> TokenBucket:
        settings = self.runtime.settings
        return TokenBucket(
            self.runtime.redis,
            ("tenant", tenant),
            settings.tenant_events_per_second,
            settings.tenant_burst_events,
        )
