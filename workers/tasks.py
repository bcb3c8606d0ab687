"""Celery tasks, registered by name (``<stage>.<verb>``) so the service can send them without
importing this module. A task opens what it needs and calls the judging code; it holds no logic."""

from __future__ import annotations

import logging
from collections import Counter
from functools import cache, lru_cache

from celery import Task

from service.config.settings import OVERRIDABLE, Settings, get_settings
from service.primitives.clock import utcnow
from service.primitives.keys import composite_key
from service.queue.messages import slices, waiting_event_pks
from service.queue.names import urgent_queue
from service.queue.tasks import (
    FANOUT_TASK,
    JUDGE_SLICE_TASK,
    JUDGE_TASK,
    KEEP_DAYS_TASK,
    PURGE_TASK,
    SWEEP_TASK,
)
from service.spend.budget import BudgetExhaustedError
from service.spend.shedding import shed_backlog
from service.store import events as event_store
from service.store import judging as judging_store
from service.store import spend as spend_repository
from service.store.engine import session_scope
from service.store.partitions import DAYS_AHEAD, day_number, ensure_days_ahead
from service.store.retention import remove_events_before
from service.telemetry.aggregates import Delta
from service.telemetry.rebuild import ensure_aggregates
from service.wiring.runtime import Runtime
from workers import judging
from workers.celery_app import app
from workers.claims import EventClaims
from workers.judge import Judge, make_judge
from workers.judge.base import TransientJudgeError
from workers.judge.calibrated import CalibratedLocalJudge
from workers.judge.local import LocalJudge

log = logging.getLogger(__name__)

# Transient judge failures are retried for about an hour in all (capped backoff), then the event
# is marked failed: still stored, visible, and re-judgeable, never silently dropped.
MAX_TASK_RETRIES = 12
MAX_COUNTDOWN_SECONDS = 300


@cache
def runtime() -> Runtime:
    return Runtime(get_settings())


@cache
def _configured_judge() -> Judge | CalibratedLocalJudge:
    settings = get_settings()
    configured = make_judge(settings, runtime().redis)
    if isinstance(configured, LocalJudge):
        return CalibratedLocalJudge(
            configured, runtime().engine, settings.local_judge_calibration_check_seconds
        )
    return configured


def judge() -> Judge:
    """The configured judge; the local one with the calibration applied last, if any."""
    configured = _configured_judge()
    if isinstance(configured, CalibratedLocalJudge):
        return configured.current()
    return configured


# A judge holds an HTTP client or an encoder model: only the re-judge run under way and the one
# before it are kept, whatever sets of overrides the queue carries.
@lru_cache(maxsize=2)
def judge_with(overrides: tuple[tuple[str, str], ...]) -> Judge:
    """A judge built from the worker's settings with some judge settings replaced (re-judging).

    Only the judge settings a re-judge may change are taken from the message; anything else in
    it is ignored, so a task cannot rewire the worker's storage or credentials.
    """
    base = get_settings()
    allowed = {name: value for name, value in overrides if name in OVERRIDABLE}
    return make_judge(Settings.model_validate({**base.model_dump(), **allowed}), runtime().redis)


@app.task(name=JUDGE_TASK, bind=True, max_retries=MAX_TASK_RETRIES)  # type: ignore[untyped-decorator]
def judge_event(self: Task, event_pk: int, judge_overrides: dict[str, str] | None = None) -> str:
    rt = runtime()
    current = judge_with(tuple(sorted(judge_overrides.items()))) if judge_overrides else judge()
    try:
        # A re-judge (with overrides) also judges events that sampling or shedding skipped.
        return judging.judge_event(rt, current, event_pk, force=bool(judge_overrides))
    except BudgetExhaustedError as exc:
        if not judge_overrides:
            return _over_budget(rt, event_pk, exc)
        # A re-judged event is not pending, so no sweeper brings it back: the task waits itself.
        _over_budget(rt, event_pk, exc, skip=False)
        countdown = min(exc.refusal.retry_after_seconds + 1, 3600)
        raise self.retry(
            exc=exc, countdown=countdown, max_retries=self.request.retries + 1
        ) from exc
    except TransientJudgeError as exc:
        _count_failures(rt, current, [exc])
        if self.request.retries >= MAX_TASK_RETRIES:
            _give_up(rt, current, event_pk, f"judge unavailable: {exc.reason}")
            return "failed"
        countdown = min(MAX_COUNTDOWN_SECONDS, 2 ** (self.request.retries + 2))
        log.warning(
            "judge failed, retrying",
            extra={"event_pk": event_pk, "reason": exc.reason, "countdown": countdown},
        )
        raise self.retry(exc=exc, countdown=countdown) from exc


def _over_budget(
    rt: Runtime, event_pk: int, exc: BudgetExhaustedError, skip: bool | None = None
) -> str:
    """Apply the budget policy: leave the event pending (the sweeper brings it back) or skip it."""
    skip = rt.settings.budget_policy == "skip" if skip is None else skip
    with session_scope(rt.engine) as session:
        event = judging_store.load_for_judging(session, event_pk)
        skipped = spend_repository.mark_skipped(session, [event_pk], "budget") if skip else []
        session.commit()
    if event is None:
        return "not_found"
    labels = {
        "tenant": event.tenant,
        "app": event.app,
        "retriever": event.retriever,
        "environment": event.environment,
        "reason": "budget",
    }
    delta = Delta()
    delta.inc("events_skipped" if skipped else "events_deferred", labels)
    rt.aggregates.add(delta)
    log.info(
        "judge budget spent",
        extra={
            "event_pk": event_pk,
            "tenant": exc.tenant,
            "window": exc.refusal.window,
            "skipped": bool(skipped),
        },
    )
    return "skipped" if skipped else "deferred"


def _give_up(rt: Runtime, current: Judge, event_pk: int, reason: str) -> None:
    with session_scope(rt.engine) as session:
        event = judging_store.load_for_judging(session, event_pk)
        judging_store.mark_failed(session, event_pk, reason)
        session.commit()
    if event is not None:
        who = current.identity
        delta = Delta()
        delta.inc(
            "events_failed",
            {
                "tenant": event.tenant,
                "app": event.app,
                "retriever": event.retriever,
                "environment": event.environment,
                "judge": who.judge,
                "prompt_version": who.prompt_version,
            },
        )
        rt.aggregates.add_once(
            composite_key("failed", str(event_pk), who.judge, who.prompt_version), delta
        )


@app.task(name=JUDGE_SLICE_TASK, bind=True)  # type: ignore[untyped-decorator]
def judge_slice(self: Task, event_pks: list[int]) -> dict[str, int]:
    """Judge a slice of events together; an event whose judge call failed goes on alone."""
    rt = runtime()
    current = judge()
    result = judging.judge_events(rt, current, event_pks)
    for pk, refused in result.over_budget.items():
        _over_budget(rt, pk, refused)
    if result.transient:
        _count_failures(rt, current, list(result.transient.values()))
        # Each failed event gets the single-event task, with its retries and backoff; the rest of
        # the slice is stored already and is not held back by them.
        queue = _queue_of(self, rt)
        with app.producer_or_acquire() as producer:
            for pk in result.transient:
                app.send_task(JUDGE_TASK, args=[pk], queue=queue, countdown=4, producer=producer)
        log.warning(
            "judge failed for part of a slice, retrying those events alone",
            extra={"events": len(result.transient), "slice": len(event_pks)},
        )
    return dict(Counter(result.outcomes.values()))


def _count_failures(rt: Runtime, current: Judge, errors: list[TransientJudgeError]) -> None:
    delta = Delta()
    for exc in errors:
        delta.inc("judge_failures", {"judge": current.identity.judge, "reason": exc.reason})
    rt.aggregates.add(delta)


def _queue_of(task: Task, rt: Runtime) -> str:
    """The queue this task came from, so urgent events stay urgent down the line."""
    delivery = getattr(task.request, "delivery_info", None) or {}
    return str(delivery.get("routing_key") or rt.settings.queue_name)


@app.task(name=FANOUT_TASK, bind=True)  # type: ignore[untyped-decorator]
def fan_out(self: Task, event_pks: list[int]) -> int:
    """Cut an accepted batch (sent once by the API) into judge tasks of a slice each."""
    rt = runtime()
    queue = _queue_of(self, rt)
    with app.producer_or_acquire() as producer:
        for part in slices(event_pks, rt.settings.judge_slice_events):
            app.send_task(JUDGE_SLICE_TASK, args=[part], queue=queue, producer=producer)
    return len(event_pks)


@app.task(name=PURGE_TASK)  # type: ignore[untyped-decorator]
def purge_old_texts() -> int:
    """Erase the texts of events older than the retention period; their scores stay."""
    rt = runtime()
    if rt.settings.retention_days <= 0:
        return 0
    cutoff = event_store.older_than(utcnow(), rt.settings.retention_days * 86400)
    purged = 0
    while True:
        with session_scope(rt.engine) as session:
            count = judging_store.purge_texts(session, cutoff, limit=1000)
            session.commit()
        purged += count
        if count < 1000:
            break
    if purged:
        log.info("purged texts past retention", extra={"count": purged})
    return purged


@app.task(name=KEEP_DAYS_TASK)  # type: ignore[untyped-decorator]
def keep_event_days() -> int:
    """Create the day partitions ahead (PostgreSQL) and remove the events past
    RM_KEEP_EVENTS_DAYS; the events removed."""
    rt = runtime()
    now = utcnow()
    ensure_days_ahead(rt.engine, day_number(now), DAYS_AHEAD)
    if rt.settings.keep_events_days <= 0:
        return 0
    cutoff = event_store.older_than(now, rt.settings.keep_events_days * 86400)
    return remove_events_before(rt.engine, cutoff).events


@app.task(name=SWEEP_TASK)  # type: ignore[untyped-decorator]
def sweep_pending() -> int:
    """Re-enqueue events left pending (a lost task, a Redis restart, a failed enqueue), and
    rebuild the shared aggregates if Redis lost them."""
    rt = runtime()
    ensure_aggregates(rt)
    shed_backlog(rt)
    now = utcnow()
    stale_before = event_store.older_than(now, rt.settings.pending_requeue_seconds)
    with session_scope(rt.engine) as session:
        stale = event_store.pending_to_requeue(session, stale_before, limit=10_000)
        # Under a backlog an event can wait in the queue longer than the requeue time: sending
        # it again would only pile copies behind it. Those keep their message and a new lease.
        # An event a worker is judging right now is not lost either: its claim says so. The
        # queue is read first, so an event taken from it meanwhile shows as claimed.
        waiting = _waiting(rt, stale) if stale else set()
        claims = EventClaims(rt.redis, judge().identity, rt.settings.pending_requeue_seconds)
        in_progress = claims.held([pk for pk in stale if pk not in waiting])
        lost = [pk for pk in stale if pk not in waiting and pk not in in_progress]
        with app.producer_or_acquire() as producer:
            for part in slices(lost, rt.settings.judge_slice_events):
                app.send_task(
                    JUDGE_SLICE_TASK, args=[part], queue=rt.settings.queue_name, producer=producer
                )
        event_store.mark_enqueued(session, stale, now)
        session.commit()
    if lost:
        log.info(
            "re-enqueued pending events",
            extra={
                "count": len(lost),
                "queued": sum(pk in waiting for pk in stale),
                "in_progress": len(in_progress),
            },
        )
    return len(lost)


def _waiting(rt: Runtime, stale: list[int]) -> set[int]:
    """Which of the ``stale`` events still have a message waiting in the judge queues.

    A Redis broker's queues are lists, read without taking anything. An AMQP broker (RabbitMQ)
    tells only how many messages wait: while any do, every stale event is taken as waiting and
    keeps its lease, and once the queues are empty, those not claimed are lost and sent again.
    So under a backlog that never drains, an event whose message was lost waits for the drain;
    docs/reliability.md says so.
    """
    broker = rt.broker_queues
    if broker.redis is not None:
        return waiting_event_pks(broker.redis, _queues(rt))
    if any(broker.depths(_queues(rt)).values()):
        return set(stale)
    return set()


def _queues(rt: Runtime) -> list[str]:
    return [rt.settings.queue_name, urgent_queue(rt.settings.queue_name)]
