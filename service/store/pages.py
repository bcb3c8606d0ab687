"""The web pages' database reads: the overview's series, the filtered event list, gold misses and
their recorded causes (and recording one).

A page asks through its filters; what a read needs of them is named structurally here
(``PageWindow``, ``EventSelection``), so the store names nothing of the pages.

A gold miss is an event with gold passage ids none of which is among its top k passages; that is
decided from the stored passages alone, so it needs no judge and shows even while judging is
pending or failed. Gold is the analysis's: the gold people marked after the fact in place of the
gold an event was sent with, and none where they disagree (``service.store.gold``).
Where an event has several scores (a rejudge), the latest one is shown.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import (
    Boolean,
    and_,
    case,
    cast,
    exists,
    false,
    func,
    literal,
    or_,
    select,
    text,
)
from sqlalchemy.orm import aliased
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, col

from service.measures.catalogue import MEASURE_NAMES, NARROW_LEAD, WIDE_LEAD
from service.primitives.clock import as_utc
from service.store import gold as gold_store
from service.store.dialect import (
    bucket_index,
    dialect_of,
    json_length_above_zero,
    json_strings,
    upsert,
)
from service.store.models import (
    Event,
    EventStatus,
    GoldLabel,
    MissCause,
    MissCauseKind,
    Passage,
    Score,
)

UNCLASSIFIED = "unclassified"
"""The cause a gold miss has until somebody records one."""
PAGE_SIZE = 50


class PageWindow(Protocol):
    """Events received in [since, until); None leaves that side open."""

    @property
    def since(self) -> datetime | None: ...

    @property
    def until(self) -> datetime | None: ...


class EventSelection(Protocol):
    """Which events a list shows: the window, the labels, a measure below a threshold, the
    outcome, gold or not, the recorded cause (a MissCauseKind value or ``UNCLASSIFIED``) and the
    page."""

    @property
    def window(self) -> PageWindow: ...

    @property
    def app(self) -> str | None: ...

    @property
    def retriever(self) -> str | None: ...

    @property
    def measure(self) -> str | None: ...

    @property
    def below(self) -> float | None: ...

    @property
    def outcome(self) -> str | None: ...

    @property
    def gold(self) -> bool | None: ...

    @property
    def cause(self) -> str | None: ...

    @property
    def page(self) -> int: ...


# Bucket widths a chart may use, in seconds: round numbers a reader can take in at a glance.
_BUCKET_LADDER: tuple[int, ...] = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
    86400, 172800, 604800,
)  # fmt: skip
CHART_POINTS = 30


def bucket_seconds(first: datetime, last: datetime, points: int = CHART_POINTS) -> int:
    """The smallest round bucket width that spreads [first, last] over at most ``points``."""
    span = max((last - first).total_seconds(), 0.0)
    for width in _BUCKET_LADDER:
        if span / width < points:
            return width
    return _BUCKET_LADDER[-1]


def _gold_query(session: Session) -> str:
    """The dialect, after telling PostgreSQL not to compile this transaction's queries.

    The gold conditions (labels over the gold sent) are correlated subqueries whose estimated
    cost, far above the real one, crosses PostgreSQL's JIT threshold: compiling took about 1.5
    s of a query that runs in 0.1 s (20,000 events, 1,000 labelled). The pages' queries are
    short reads that never gain from it. SET LOCAL ends with the transaction.
    """
    dialect = dialect_of(session)
    if dialect == "postgresql":
        session.execute(text("SET LOCAL jit = off"))
    return dialect


def _in_prompt(ids: Any) -> ColumnElement[bool]:
    """True when one of ``ids`` (a table of passage ids) is among the event's top k passages."""
    return exists(
        select(literal(1))
        .select_from(Passage)
        .join(ids, col(Passage.passage_id) == ids.c.value)
        .where(col(Passage.event_pk) == col(Event.id), col(Passage.rank) <= col(Event.k))
        # The event is the outer query's even two levels down (inside a label's subquery),
        # where automatic correlation would read every event instead.
        .correlate(Event)
    )


# --- gold: labels over the gold sent with the event -----------------------------------------------
#
# The rule of service.store.gold (``consensus``), as conditions on ``events`` so that a page of
# misses is counted and paged by the database: an event somebody labelled takes its labellers'
# gold when they all agree (same outcome, same set of passages) and that outcome marks passages;
# labellers who differ take the event out of the gold set; an event nobody labelled keeps the gold
# it was sent with. tests/integration/ui/test_misses_labelled.py holds these conditions to
# ``consensus`` on both stores.


def _labelled() -> ColumnElement[bool]:
    return exists().where(col(GoldLabel.event_pk) == col(Event.id))


def _labellers_differ(dialect: str) -> ColumnElement[bool]:
    """Two labels of the event with different outcomes, or a passage one marks and the other
    does not (every ordered pair is tried, so an extra passage on either side shows)."""
    one, other = aliased(GoldLabel), aliased(GoldLabel)
    mine = json_strings(dialect, col(one.passage_ids), "mine", checked=True)
    theirs = json_strings(dialect, col(other.passage_ids), "theirs", checked=True)
    unmatched = exists(
        select(literal(1))
        .select_from(mine)
        .where(
            ~exists(select(literal(1)).select_from(theirs).where(theirs.c.value == mine.c.value))
        )
    )
    return exists(
        select(literal(1))
        .select_from(one)
        .join(other, col(other.event_pk) == col(one.event_pk))
        .where(
            col(one.event_pk) == col(Event.id),
            or_(col(one.outcome) != col(other.outcome), unmatched),
        )
    )


def _label_marks_passages(dialect: str) -> ColumnElement[bool]:
    label = aliased(GoldLabel)
    return exists(
        select(literal(1)).where(
            col(label.event_pk) == col(Event.id),
            col(label.outcome).in_(sorted(gold_store.MARKS_PASSAGES)),
            json_length_above_zero(dialect, col(label.passage_ids)),
        )
    )


def _label_gold_reached(dialect: str) -> ColumnElement[bool]:
    label = aliased(GoldLabel)
    ids = json_strings(dialect, col(label.passage_ids), "label_ids", checked=True)
    return exists(
        select(literal(1)).where(
            col(label.event_pk) == col(Event.id),
            col(label.outcome).in_(sorted(gold_store.MARKS_PASSAGES)),
            _in_prompt(ids),
        )
    )


def _has_gold(dialect: str) -> ColumnElement[bool]:
    """True when the event is a gold question: sent with gold nobody relabelled, or labelled
    with passages by labellers who agree."""
    sent = col(Event.gold)  # set at ingest when gold passage ids came with the event
    agreed = and_(~_labellers_differ(dialect), _label_marks_passages(dialect))
    # CASE, not OR: an event nobody labelled (most) costs one index probe more, never the
    # labels' subqueries.
    return cast(case((_labelled(), agreed), else_=sent), Boolean)


def _gold_reached(dialect: str) -> ColumnElement[bool]:
    """True when a gold passage (as ``_has_gold`` takes it) is among the event's top k; only
    meaningful together with ``_has_gold``, which rules the disagreements out."""
    sent = _in_prompt(json_strings(dialect, col(Event.gold_passage_ids), "gold_ids"))
    return cast(case((_labelled(), _label_gold_reached(dialect)), else_=sent), Boolean)


def _window_conditions(tenant: str, window: PageWindow) -> list[ColumnElement[bool]]:
    conditions = [col(Event.tenant) == tenant]
    if window.since is not None:
        conditions.append(col(Event.received_at) >= window.since)
    if window.until is not None:
        conditions.append(col(Event.received_at) < window.until)
    return conditions


# --- overview -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeriesPoint:
    start: datetime
    events: int
    means: dict[str, float | None]


@dataclass
class JudgeSlice:
    """What one judge and prompt version said about one app and retriever in the window."""

    judge: str
    prompt_version: str
    scored: int
    latest_score_id: int
    means: dict[str, float | None] = field(default_factory=dict)
    narrow: int = 0
    """Events with K/N^_p at most 1 (N^_p = 0 counts as wide: nothing relevant in the window)."""
    series: list[SeriesPoint] = field(default_factory=list)

    @property
    def narrow_share(self) -> float | None:
        return self.narrow / self.scored if self.scored else None

    @property
    def lead(self) -> str:
        share = self.narrow_share
        # The measure the regime says to lead with (DESIGN, "K/N^_p: the regime").
        return NARROW_LEAD if share is not None and share >= 0.5 else WIDE_LEAD


@dataclass
class GroupOverview:
    app: str
    retriever: str
    events: int = 0
    judged: int = 0
    pending: int = 0
    failed: int = 0
    gold: int = 0
    misses: int = 0
    judges: list[JudgeSlice] = field(default_factory=list)
    """Most recently used first; the first is the one "in use"."""

    @property
    def in_use(self) -> JudgeSlice | None:
        return self.judges[0] if self.judges else None


@dataclass(frozen=True)
class Overview:
    groups: list[GroupOverview]
    bucket_seconds: int
    first: datetime | None
    last: datetime | None


def overview(session: Session, tenant: str, window: PageWindow) -> Overview:
    dialect = _gold_query(session)
    where = _window_conditions(tenant, window)
    groups: dict[tuple[str, str], GroupOverview] = {}
    has_gold = _has_gold(dialect)
    is_miss = and_(has_gold, ~_gold_reached(dialect))
    counts = session.execute(
        select(
            col(Event.app),
            col(Event.retriever),
            func.count(),
            func.sum(case((col(Event.status) == EventStatus.JUDGED.value, 1), else_=0)),
            func.sum(case((col(Event.status) == EventStatus.PENDING.value, 1), else_=0)),
            func.sum(case((col(Event.status) == EventStatus.FAILED.value, 1), else_=0)),
            func.sum(case((has_gold, 1), else_=0)),
            func.sum(case((is_miss, 1), else_=0)),
            func.min(col(Event.received_at)),
            func.max(col(Event.received_at)),
        )
        .where(*where)
        .group_by(col(Event.app), col(Event.retriever))
        .order_by(col(Event.app), col(Event.retriever))
    ).all()
    first: datetime | None = None
    last: datetime | None = None
    for app, retriever, n, judged, pending, failed, gold, misses, lo, hi in counts:
        groups[(app, retriever)] = GroupOverview(
            app, retriever, int(n), int(judged), int(pending), int(failed), int(gold), int(misses)
        )
        first = as_utc(lo) if first is None else min(first, as_utc(lo))
        last = as_utc(hi) if last is None else max(last, as_utc(hi))
    if not groups or first is None or last is None:
        return Overview([], 1, None, None)

    measures = [getattr(Score, name) for name in MEASURE_NAMES]
    kn = col(Score.k_over_np_est)
    slices = session.execute(
        select(
            col(Event.app),
            col(Event.retriever),
            col(Score.judge),
            col(Score.prompt_version),
            func.count(),
            func.max(col(Score.id)),
            func.sum(case((and_(kn.is_not(None), kn <= 1.0), 1), else_=0)),
            *[func.avg(m) for m in measures],
        )
        .join(Event, col(Event.id) == col(Score.event_pk))
        .where(*where)
        .group_by(col(Event.app), col(Event.retriever), col(Score.judge), col(Score.prompt_version))
    ).all()
    by_judge: dict[tuple[str, str, str, str], JudgeSlice] = {}
    for app, retriever, judge, version, n, latest, narrow, *means in slices:
        judge_slice = JudgeSlice(
            judge,
            version,
            int(n),
            int(latest),
            dict(zip(MEASURE_NAMES, (_number(v) for v in means), strict=True)),
            int(narrow),
        )
        groups[(app, retriever)].judges.append(judge_slice)
        by_judge[(app, retriever, judge, version)] = judge_slice
    for group in groups.values():
        group.judges.sort(key=lambda s: s.latest_score_id, reverse=True)

    width = bucket_seconds(first, last)
    start = datetime.fromtimestamp(math.floor(first.timestamp() / width) * width, UTC)
    bucket = bucket_index(dialect, col(Event.received_at), start, width).label("bucket")
    rows = session.execute(
        select(
            col(Event.app),
            col(Event.retriever),
            col(Score.judge),
            col(Score.prompt_version),
            bucket,
            func.count(),
            *[func.avg(m) for m in measures],
        )
        .join(Event, col(Event.id) == col(Score.event_pk))
        .where(*where)
        .group_by(
            col(Event.app),
            col(Event.retriever),
            col(Score.judge),
            col(Score.prompt_version),
            bucket,
        )
        .order_by(bucket)
    ).all()
    for app, retriever, judge, version, index, n, *means in rows:
        by_judge[(app, retriever, judge, version)].series.append(
            SeriesPoint(
                start + timedelta(seconds=int(index) * width),
                int(n),
                dict(zip(MEASURE_NAMES, (_number(v) for v in means), strict=True)),
            )
        )
    return Overview(list(groups.values()), width, start, last)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


# --- the event list -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    pk: int
    event_id: str
    received_at: datetime
    app: str
    retriever: str
    status: str
    query: str
    k: int
    has_gold: bool
    gold_reached: bool
    measures: dict[str, float | None]
    cause: str | None

    @property
    def outcome(self) -> str | None:
        """hit or miss: gold decides when the event has it, else the judge's hit."""
        if self.has_gold:
            return "hit" if self.gold_reached else "miss"
        hit = self.measures.get("hit")
        if hit is None:
            return None
        return "hit" if hit > 0 else "miss"


@dataclass(frozen=True)
class EventPage:
    rows: list[EventRow]
    total: int
    page: int
    pages: int


def _filter_conditions(
    dialect: str, tenant: str, chosen: EventSelection
) -> list[ColumnElement[bool]]:
    conditions = _window_conditions(tenant, chosen.window)
    if chosen.app:
        conditions.append(col(Event.app) == chosen.app)
    if chosen.retriever:
        conditions.append(col(Event.retriever) == chosen.retriever)
    has_gold = _has_gold(dialect)
    if chosen.gold is not None:
        conditions.append(has_gold if chosen.gold else ~has_gold)
    if chosen.measure and chosen.below is not None:
        conditions.append(getattr(Score, chosen.measure) < chosen.below)
    if chosen.outcome is not None:
        reached = _gold_reached(dialect)
        judge_hit = col(Score.hit)
        if chosen.outcome == "hit":
            conditions.append(or_(and_(has_gold, reached), and_(~has_gold, judge_hit > 0)))
        else:
            conditions.append(or_(and_(has_gold, ~reached), and_(~has_gold, judge_hit == 0)))
    if chosen.cause == UNCLASSIFIED:
        conditions.append(col(MissCause.cause).is_(None))
    elif chosen.cause:
        conditions.append(col(MissCause.cause) == chosen.cause)
    return conditions


def _scored_events() -> Any:
    """Events with their latest score (if any) and recorded cause (if any)."""
    newer = aliased(Score)
    # "No newer score of the event" rather than id = max(id): PostgreSQL may answer a max() by
    # walking the primary key backwards (one full scan per event when its statistics are stale),
    # while this can only be looked up through the scores' event index.
    latest = ~exists(
        select(literal(1)).where(
            col(newer.event_pk) == col(Score.event_pk), col(newer.id) > col(Score.id)
        )
    )
    return (
        select(Event)
        .outerjoin(Score, and_(col(Score.event_pk) == col(Event.id), latest))
        .outerjoin(MissCause, col(MissCause.event_pk) == col(Event.id))
    )


def list_events(
    session: Session,
    tenant: str,
    chosen: EventSelection,
    *,
    misses_only: bool = False,
    page_size: int = PAGE_SIZE,
) -> EventPage:
    dialect = _gold_query(session)
    conditions = _filter_conditions(dialect, tenant, chosen)
    reached = _gold_reached(dialect)
    has_gold = _has_gold(dialect)
    if misses_only:
        conditions += [has_gold, ~reached]
    base = _scored_events().where(*conditions)
    total = int(session.execute(select(func.count()).select_from(base.subquery())).scalar_one())
    pages = max(1, math.ceil(total / page_size))
    page = min(chosen.page, pages)
    statement = (
        base.with_only_columns(
            col(Event.id),
            col(Event.event_id),
            col(Event.received_at),
            col(Event.app),
            col(Event.retriever),
            col(Event.status),
            col(Event.query),
            col(Event.k),
            has_gold.label("has_gold"),
            case((has_gold, reached), else_=false()).label("reached"),
            col(MissCause.cause),
            *[getattr(Score, name) for name in MEASURE_NAMES],
            maintain_column_froms=True,
        )
        .order_by(col(Event.received_at).desc(), col(Event.id).desc())
        .limit(page_size)
        .offset((page - 1) * page_size)
    )
    rows = [
        EventRow(
            pk=pk,
            event_id=event_id,
            received_at=as_utc(received),
            app=app,
            retriever=retriever,
            status=status,
            query=query,
            k=k,
            has_gold=bool(gold),
            gold_reached=bool(hit),
            cause=cause,
            measures=dict(zip(MEASURE_NAMES, (_number(v) for v in values), strict=True)),
        )
        for pk, event_id, received, app, retriever, status, query, k, gold, hit, cause, *values in (
            session.execute(statement).all()
        )
    ]
    return EventPage(rows, total, page, pages)


@dataclass(frozen=True)
class LabelChoices:
    apps: list[str]
    retrievers: list[str]


def label_choices(session: Session, tenant: str, window: PageWindow) -> LabelChoices:
    rows = session.execute(
        select(col(Event.app), col(Event.retriever))
        .where(*_window_conditions(tenant, window))
        .distinct()
    ).all()
    return LabelChoices(sorted({r[0] for r in rows}), sorted({r[1] for r in rows}))


# --- misses and their causes ----------------------------------------------------------------------


@dataclass(frozen=True)
class CauseCounts:
    gold_events: int
    misses: int
    by_cause: dict[str, int]
    """Every cause, zero included, and ``unclassified``."""

    @property
    def classified(self) -> int:
        return self.misses - self.by_cause.get(UNCLASSIFIED, 0)


def cause_counts(session: Session, tenant: str, chosen: EventSelection) -> CauseCounts:
    dialect = _gold_query(session)
    has_gold = _has_gold(dialect)
    conditions = _window_conditions(tenant, chosen.window)
    if chosen.app:
        conditions.append(col(Event.app) == chosen.app)
    if chosen.retriever:
        conditions.append(col(Event.retriever) == chosen.retriever)
    gold_events = int(
        session.execute(select(func.count()).where(*conditions, has_gold)).scalar_one()
    )
    rows = session.execute(
        select(col(MissCause.cause), func.count())
        .select_from(Event)
        .outerjoin(MissCause, col(MissCause.event_pk) == col(Event.id))
        .where(*conditions, has_gold, ~_gold_reached(dialect))
        .group_by(col(MissCause.cause))
    ).all()
    by_cause = {kind.value: 0 for kind in MissCauseKind}
    by_cause[UNCLASSIFIED] = 0
    for cause, n in rows:
        by_cause[cause or UNCLASSIFIED] = by_cause.get(cause or UNCLASSIFIED, 0) + int(n)
    return CauseCounts(gold_events, sum(by_cause.values()), by_cause)


def is_gold_miss(session: Session, event_pk: int) -> bool:
    dialect = _gold_query(session)
    found = session.execute(
        select(col(Event.id)).where(
            col(Event.id) == event_pk, _has_gold(dialect), ~_gold_reached(dialect)
        )
    ).first()
    return found is not None


def find_cause(session: Session, event_pk: int) -> MissCause | None:
    return session.get(MissCause, event_pk)


def record_cause(
    session: Session, event_pk: int, cause: MissCauseKind, note: str | None, now: datetime
) -> MissCause:
    """Store the event's cause, replacing the one recorded before. The caller commits."""
    values = {"event_pk": event_pk, "cause": cause.value, "note": note, "recorded_at": now}
    upsert(session, MissCause, values, key=["event_pk"])
    return MissCause(event_pk=event_pk, cause=cause.value, note=note, recorded_at=now)


def next_unclassified_miss(
    session: Session, tenant: str, chosen: EventSelection, after_pk: int
) -> str | None:
    """The newest unclassified gold miss of the filter but ``after_pk``: the one to read next."""
    dialect = _gold_query(session)
    conditions = _window_conditions(tenant, chosen.window)
    if chosen.app:
        conditions.append(col(Event.app) == chosen.app)
    if chosen.retriever:
        conditions.append(col(Event.retriever) == chosen.retriever)
    found = session.execute(
        select(col(Event.event_id))
        .outerjoin(MissCause, col(MissCause.event_pk) == col(Event.id))
        .where(
            *conditions,
            col(Event.id) != after_pk,
            col(MissCause.cause).is_(None),
            _has_gold(dialect),
            ~_gold_reached(dialect),
        )
        .order_by(col(Event.received_at).desc(), col(Event.id).desc())
        .limit(1)
    ).first()
    return None if found is None else str(found[0])


def gold_ranks(session: Session, event_pks: Sequence[int]) -> dict[int, dict[str, int]]:
    """For each event, the rank at which each of its gold passages (labels over the gold sent,
    as ``_has_gold`` takes them) was sent (absent: not sent)."""
    if not event_pks:
        return {}
    labels = gold_store.labels_of(session, event_pks)
    gold_by_event = {
        pk: set(gold_store.consensus(ids, None, labels.get(pk, [])).gold_passage_ids or [])
        for pk, ids in session.execute(
            select(col(Event.id), col(Event.gold_passage_ids)).where(
                col(Event.id).in_(list(event_pks))
            )
        )
    }
    ranks: dict[int, dict[str, int]] = defaultdict(dict)
    for pk, rank, passage_id in session.execute(
        select(col(Passage.event_pk), col(Passage.rank), col(Passage.passage_id))
        .where(col(Passage.event_pk).in_(list(event_pks)))
        .order_by(col(Passage.rank))
    ):
        if passage_id in gold_by_event.get(pk, set()):
            ranks[pk].setdefault(passage_id, rank)
    return {pk: dict(ranks.get(pk, {})) for pk in event_pks}
