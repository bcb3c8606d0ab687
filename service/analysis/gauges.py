"""Judge-against-gold agreement as Prometheus gauges, so a dashboard can show the smoke alarm
next to its calibration against the instrument.

Families (labels: tenant, judge, prompt_version), over each tenant's gold events received in a
recent window:
- retrieval_monitor_judge_gold_kappa: Cohen's kappa of the judge's relevance against gold
- retrieval_monitor_judge_gold_precision: share of judge-relevant passages that are gold (0-1)
- retrieval_monitor_judge_gold_recall: share of retrieved gold passages the judge found (0-1)
- retrieval_monitor_judge_gold_passages: labelled passages of gold events behind the figures

And the people who mark gold against each other (label: tenant, over the events of the last
``AGREEMENT_WINDOW`` that two people or more labelled in the pages or through the gold API):
- retrieval_monitor_gold_labeller_kappa: pooled Cohen's kappa of their (event, passage) decisions
- retrieval_monitor_gold_labeller_shared_events: events labelled by two people or more
- retrieval_monitor_gold_labeller_disagreements: of those, the ones they disagree on (left out of
  the gold set)

A ratio that cannot be computed (e.g. precision of a judge that never said "relevant") has no
sample rather than a made-up 0, and a judge without gold events in the window has no series.
The figures come from the database, so every replica reports the same ones. They are computed
per tenant: the judge is shared, but the gold labels are a tenant's own data, so a tenant sending
wrong gold labels moves its own agreement series (and its own drift alert), never another's.
``CachedCalibrationGauges`` and ``CachedAgreementGauges`` are the ``Collector``s the ``/metrics``
page registers for them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from service.analysis.agreement import Agreement
from service.analysis.calibration import JudgeCalibration, calibrate
from service.analysis.dataset import label_pairs
from service.analysis.gold_queue import window_agreement
from service.primitives.clock import utcnow
from service.store import analysis as repo
from service.store import gold as gold_store
from service.store.analysis import EventWindow
from service.store.engine import session_scope

log = logging.getLogger(__name__)

NAMESPACE = "retrieval_monitor"
Figures = TypeVar("Figures")
LABELS = ("tenant", "judge", "prompt_version")
DEFAULT_WINDOW = timedelta(hours=24)
# Enough for a day of gold traffic; a gold set is hand-made and small.
MAX_GOLD_EVENTS = 20_000
# People label events days after they arrive; their agreement is read over a longer window.
AGREEMENT_WINDOW = timedelta(days=30)


@dataclass(frozen=True)
class GaugeFamily(Generic[Figures]):
    """One gauge family read off a set of figures (the judge's against gold, the labellers')."""

    name: str
    help: str
    value: Callable[[Figures], float]

    @property
    def full_name(self) -> str:
        return f"{NAMESPACE}_{self.name}"


GAUGES: tuple[GaugeFamily[JudgeCalibration], ...] = (
    GaugeFamily(
        "judge_gold_kappa",
        "Cohen's kappa of the judge's relevance labels against gold labels, recent window.",
        lambda c: c.kappa.kappa,
    ),
    GaugeFamily(
        "judge_gold_precision",
        "Share of passages the judge called relevant that are gold passages, recent window.",
        lambda c: c.precision.value,
    ),
    GaugeFamily(
        "judge_gold_recall",
        "Share of retrieved gold passages the judge called relevant, recent window.",
        lambda c: c.recall.value,
    ),
    GaugeFamily(
        "judge_gold_passages",
        "Labelled passages of gold events behind the judge-against-gold gauges.",
        lambda c: float(c.passages),
    ),
)


AGREEMENT_GAUGES: tuple[GaugeFamily[Agreement], ...] = (
    GaugeFamily(
        "gold_labeller_kappa",
        "Cohen's kappa between the people labelling gold, over passages of events two labelled.",
        lambda a: a.pooled.kappa,
    ),
    GaugeFamily(
        "gold_labeller_shared_events",
        "Events labelled by two people or more, behind the labellers' kappa.",
        lambda a: float(a.shared_events),
    ),
    GaugeFamily(
        "gold_labeller_disagreements",
        "Events labelled by two people or more who disagree; left out of the gold set.",
        lambda a: float(a.disagreed),
    ),
)


def labeller_agreements(
    session: Session, *, window: timedelta = AGREEMENT_WINDOW, now: datetime | None = None
) -> dict[str, Agreement]:
    """Per tenant with labelled events in the window, its labellers' agreement."""
    end = now or utcnow()
    every = EventWindow(end - window, end, tenant=None)
    return {
        tenant: window_agreement(session, EventWindow(end - window, end, tenant=tenant))
        for tenant in gold_store.labelled_tenants(session, every.conditions())
    }


def agreement_families(agreements: dict[str, Agreement]) -> list[Metric]:
    families: list[Metric] = []
    for gauge in AGREEMENT_GAUGES:
        family = GaugeMetricFamily(gauge.full_name, gauge.help, labels=["tenant"])
        for tenant, found in sorted(agreements.items()):
            value = gauge.value(found)
            if found.shared_events and not math.isnan(value):
                family.add_metric([tenant], value)
        families.append(family)
    return families


def recent_calibration(
    session: Session,
    *,
    window: timedelta = DEFAULT_WINDOW,
    now: datetime | None = None,
    tenant: str | None = None,
) -> list[JudgeCalibration]:
    end = now or utcnow()
    events = repo.gold_events_in_window(
        session, EventWindow(end - window, end, tenant=tenant, max_events=MAX_GOLD_EVENTS)
    )
    pks = [e.pk for e in events]
    judgments = repo.labelled_judgments(session, pks)
    return calibrate(label_pairs(events, repo.passage_ids(session, pks), judgments))


def calibration_gauges(
    session: Session,
    *,
    window: timedelta = DEFAULT_WINDOW,
    now: datetime | None = None,
    tenant: str | None = None,
) -> list[Metric]:
    """The gauge families of ``GAUGES`` for the gold events of the last ``window``, per tenant
    (only ``tenant``'s when given)."""
    end = now or utcnow()
    if tenant is not None:
        tenants = [tenant]
    else:
        tenants = repo.gold_tenants_in_window(session, EventWindow(end - window, end))
    return gauge_families(
        {t: recent_calibration(session, window=window, now=end, tenant=t) for t in tenants}
    )


def gauge_families(calibrations: Mapping[str, Sequence[JudgeCalibration]]) -> list[Metric]:
    """One family per gauge of ``GAUGES``, with a sample per tenant and judge that has a
    value."""
    families: list[Metric] = []
    for gauge in GAUGES:
        family = GaugeMetricFamily(gauge.full_name, gauge.help, labels=list(LABELS))
        for tenant, judged in calibrations.items():
            for calibration in judged:
                value = gauge.value(calibration)
                if not math.isnan(value):
                    family.add_metric(
                        [tenant, calibration.judge, calibration.prompt_version], value
                    )
        families.append(family)
    return families


class _CachedGauges(Collector):
    """Gauge families read from the database at most every ``ttl_seconds``: a scrape every 15 s
    should not re-read days of gold judgments and labels each time, and the figures move slowly.
    A failed read keeps the last figures (a scrape must not fail for it) and is tried again after
    the ttl."""

    what = "gauges"

    def __init__(self, engine: Engine, *, ttl_seconds: float = 60.0) -> None:
        self.engine = engine
        self.ttl_seconds = ttl_seconds
        self._lock = threading.Lock()
        self._expires = 0.0
        self._families: list[Metric] = []

    def read(self, session: Session) -> list[Metric]:
        raise NotImplementedError

    def expire(self) -> None:
        """Make the next ``collect`` read the database again, whatever the ttl left."""
        with self._lock:
            self._expires = 0.0

    def collect(self) -> list[Metric]:
        with self._lock:
            if time.monotonic() >= self._expires:
                self._expires = time.monotonic() + self.ttl_seconds
                try:
                    with session_scope(self.engine) as session:
                        self._families = self.read(session)
                except SQLAlchemyError:
                    log.warning("%s not refreshed", self.what, exc_info=True)
            return list(self._families)


class CachedCalibrationGauges(_CachedGauges):
    """``calibration_gauges`` (the judge against each tenant's gold), cached."""

    what = "judge calibration gauges"

    def __init__(
        self,
        engine: Engine,
        *,
        ttl_seconds: float = 60.0,
        window: timedelta = DEFAULT_WINDOW,
        tenant: str | None = None,
    ) -> None:
        super().__init__(engine, ttl_seconds=ttl_seconds)
        self.window = window
        self.tenant = tenant

    def describe(self) -> list[Metric]:
        return gauge_families({})

    def read(self, session: Session) -> list[Metric]:
        return calibration_gauges(session, window=self.window, tenant=self.tenant)


class CachedAgreementGauges(_CachedGauges):
    """The labellers' agreement gauges (``AGREEMENT_GAUGES``), cached."""

    what = "labeller agreement gauges"

    def describe(self) -> list[Metric]:
        return agreement_families({})

    def read(self, session: Session) -> list[Metric]:
        return agreement_families(labeller_agreements(session))
