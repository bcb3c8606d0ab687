"""Gold marked by people after the fact: one row per (event, labeller), and the rule that turns
an event's rows (and the gold it was sent with) into the gold the analysis uses.

The rule, in one place so that the analysis, the calibration, the labelling page and the export
agree:

- no label: the event's own ``gold_passage_ids`` and ``answer_correct`` stand;
- labels: they replace the gold the event was sent with (people read the passages);
  - every labeller gave the same outcome and the same passages: that is the gold (``answered``
    and ``not_retrieved`` mark passages; ``not_in_corpus`` and ``ambiguous`` make the event no
    gold question at all);
  - they differ: the event is a disagreement and leaves the gold set. As the article says, two
    people marking different passages means the question is underspecified; the honest answer
    is to split it, not to pick a winner, so no label wins;
  - correctness: the labellers' common verdict when every one who gave one agrees, none when
    they differ, and the event's own feedback when no labeller gave one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import BigInteger, cast, func, literal, not_, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Join
from sqlmodel import Session, col

from service.store.dialect import upsert
from service.store.models import Event, GoldLabel, GoldOutcome, table

CHUNK = 900
MARKS_PASSAGES = frozenset({GoldOutcome.ANSWERED.value, GoldOutcome.NOT_RETRIEVED.value})
WITHOUT_GOLD = frozenset({GoldOutcome.NOT_IN_CORPUS.value, GoldOutcome.AMBIGUOUS.value})


@dataclass(frozen=True)
class LabelRow:
    event_pk: int
    labeller: str
    labeller_name: str
    outcome: str
    passage_ids: tuple[str, ...]
    missing_text: str | None
    answer_correct: bool | None
    labelled_at: datetime

    @property
    def key(self) -> tuple[str, frozenset[str]]:
        """What two labellers must share to agree."""
        return self.outcome, frozenset(self.passage_ids)


ConsensusStatus = Literal["unlabelled", "single", "agreed", "disagreed"]


@dataclass(frozen=True)
class Consensus:
    status: ConsensusStatus
    gold_passage_ids: list[str] | None
    answer_correct: bool | None
    outcome: str | None  # the agreed outcome; None unlabelled or disagreed


def consensus(
    sent_gold: Sequence[str] | None, sent_correct: bool | None, labels: Sequence[LabelRow]
) -> Consensus:
    """The gold the analysis uses for one event (the module docstring gives the rule)."""
    if not labels:
        return Consensus("unlabelled", list(sent_gold) if sent_gold else None, sent_correct, None)
    verdicts = {label.answer_correct for label in labels if label.answer_correct is not None}
    correct = sent_correct if not verdicts else (verdicts.pop() if len(verdicts) == 1 else None)
    keys = {label.key for label in labels}
    if len(keys) > 1:
        return Consensus("disagreed", None, correct, None)
    outcome, ids = next(iter(keys))
    gold = sorted(ids) if outcome in MARKS_PASSAGES and ids else None
    return Consensus("single" if len(labels) == 1 else "agreed", gold, correct, outcome)


def save_label(session: Session, row: LabelRow) -> None:
    """Store one labeller's gold for an event, replacing what that labeller said before. The
    caller commits."""
    values: dict[str, Any] = {
        "event_pk": row.event_pk,
        "labeller": row.labeller,
        "labeller_name": row.labeller_name,
        "outcome": row.outcome,
        "passage_ids": list(row.passage_ids),
        "missing_text": row.missing_text,
        "answer_correct": row.answer_correct,
        "labelled_at": row.labelled_at,
    }
    upsert(session, GoldLabel, values, key=["event_pk", "labeller"])


def _chunks(keys: Sequence[int]) -> Iterator[list[int]]:
    for start in range(0, len(keys), CHUNK):
        yield list(keys[start : start + CHUNK])


def _row(label: GoldLabel) -> LabelRow:
    return LabelRow(
        event_pk=label.event_pk,
        labeller=label.labeller,
        labeller_name=label.labeller_name,
        outcome=label.outcome,
        passage_ids=tuple(label.passage_ids or ()),
        missing_text=label.missing_text,
        answer_correct=label.answer_correct,
        labelled_at=label.labelled_at,
    )


def labels_of(session: Session, event_pks: Sequence[int]) -> dict[int, list[LabelRow]]:
    """Every label of the given events, per event, in the order they were first written."""
    out: dict[int, list[LabelRow]] = defaultdict(list)
    for chunk in _chunks(list(event_pks)):
        rows = session.execute(
            select(GoldLabel).where(col(GoldLabel.event_pk).in_(chunk)).order_by(col(GoldLabel.id))
        ).scalars()
        for label in rows:
            out[label.event_pk].append(_row(label))
    return dict(out)


def labels_in(
    session: Session, conditions: Sequence[ColumnElement[bool]]
) -> dict[int, list[LabelRow]]:
    """Every label of the events matching ``conditions`` (a window), in one query: a window of
    many events needs no list of their keys."""
    out: dict[int, list[LabelRow]] = defaultdict(list)
    rows = session.execute(
        select(GoldLabel)
        .select_from(labels_then_events())
        .where(*conditions)
        .order_by(col(GoldLabel.id))
    ).scalars()
    for label in rows:
        out[label.event_pk].append(_row(label))
    return dict(out)


@dataclass(frozen=True)
class SampleCandidate:
    pk: int
    event_id: str
    app: str
    retriever: str
    query: str


# The pool of the labelling queue, when a window holds more events than it may, is a sample
# drawn in SQL: the events with the smallest (pk * A + seed) mod P, a multiplicative hash (A is
# Knuth's 2^32/phi, P the first prime over 2^32) that both stores compute the same way and that
# the seed reshuffles. Within the pool the sampler draws by SHA-256 as for a smaller window.
_SHUFFLE_FACTOR = 2654435761
_SHUFFLE_PRIME = 4294967311
# Queries are compared (for "no question twice") on this many first characters.
QUESTION_CHARS = 500


def sample_candidates(
    session: Session,
    conditions: Sequence[ColumnElement[bool]],
    seed: int,
    limit: int | None,
) -> list[SampleCandidate]:
    """The events matching ``conditions`` (a window) as the sampler needs them: all of them, or
    ``limit`` of them drawn by ``seed`` when the window holds more. Narrow rows
    (``RM_KEEP_TEXTS``) are left out: there is no question or passage to show a labeller."""
    statement = select(
        col(Event.id),
        col(Event.event_id),
        col(Event.app),
        col(Event.retriever),
        func.substr(col(Event.query), 1, QUESTION_CHARS),
    ).where(*conditions, col(Event.texts_kept))
    if limit is not None:
        pk = cast(col(Event.id), BigInteger)  # 64-bit arithmetic on PostgreSQL too
        prime = literal(_SHUFFLE_PRIME, BigInteger)
        # (pk * factor + seed) mod prime, with every product below 2**63: PostgreSQL's keys
        # carry their day in the high bits (service/store/partitions.py), and pk * factor
        # would overflow. The factor is split in 16-bit halves; the order is the same.
        reduced = pk % prime
        high = literal(_SHUFFLE_FACTOR >> 16, BigInteger)
        low = literal(_SHUFFLE_FACTOR & 0xFFFF, BigInteger)
        product = ((reduced * high) % prime * literal(65536, BigInteger) + reduced * low) % prime
        shuffled = (product + literal(seed % _SHUFFLE_PRIME, BigInteger)) % prime
        statement = statement.order_by(shuffled, col(Event.id)).limit(limit)
    rows = session.execute(statement).all()
    return [SampleCandidate(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4])) for r in rows]


def narrow_events(session: Session, conditions: Sequence[ColumnElement[bool]]) -> int:
    """Events matching ``conditions`` stored narrow, which the sampler leaves out."""
    return int(
        session.execute(
            select(func.count()).where(*conditions, not_(col(Event.texts_kept)))
        ).scalar_one()
    )


def events_by_pk(session: Session, event_pks: Sequence[int]) -> Mapping[int, Event]:
    out: dict[int, Event] = {}
    for chunk in _chunks(list(event_pks)):
        for event in session.execute(select(Event).where(col(Event.id).in_(chunk))).scalars():
            if event.id is not None:
                out[event.id] = event
    return out


def labelled_event_pks(session: Session, conditions: Sequence[ColumnElement[bool]]) -> list[int]:
    """The events matching ``conditions`` (a window) that somebody labelled, oldest first."""
    rows = session.execute(
        select(col(Event.id))
        .select_from(labelled_events())
        .where(*conditions)
        .order_by(col(Event.id))
    ).all()
    return [int(row[0]) for row in rows]


def labelled_tenants(session: Session, conditions: Sequence[ColumnElement[bool]]) -> list[str]:
    """The tenants with labelled events matching ``conditions``."""
    rows = session.execute(
        select(col(Event.tenant))
        .select_from(labelled_events())
        .where(*conditions)
        .distinct()
        .order_by(col(Event.tenant))
    ).all()
    return [str(row[0]) for row in rows]


class _LabelsThenEvents(Join):
    """Labels (or the labelled events' keys) joined to their events, read in that order on
    SQLite too.

    Labels are hand-made and few; the events of a window are a day of traffic. Without
    statistics SQLite takes an equality on an indexed column (a window's tenant) for the fewer
    rows and read every event of the tenant to keep the labelled ones; its CROSS JOIN keeps the
    order written. PostgreSQL has no such form and plans the join itself.
    """

    inherit_cache = True


@compiles(_LabelsThenEvents, "sqlite")
def _cross_join(join: _LabelsThenEvents, compiler: SQLCompiler, **kw: Any) -> str:
    assert join.onclause is not None  # built with one by the functions below
    on = compiler.process(join.onclause, **kw)
    tables = {**kw, "asfrom": True}
    left, right = compiler.process(join.left, **tables), compiler.process(join.right, **tables)
    return f"{left} CROSS JOIN {right} ON {on}"


def labelled_events() -> _LabelsThenEvents:
    """FROM each labelled event once: the distinct keys of the labels, then their events (a
    select over it needs no DISTINCT, which PostgreSQL refuses on a json column)."""
    keys = select(col(GoldLabel.event_pk)).distinct().subquery("labelled")
    return _LabelsThenEvents(keys, table(Event), col(Event.id) == keys.c.event_pk)


def labels_then_events() -> _LabelsThenEvents:
    """FROM every label, then its event (several rows for an event labelled several times)."""
    return _LabelsThenEvents(
        table(GoldLabel), table(Event), col(Event.id) == col(GoldLabel.event_pk)
    )
