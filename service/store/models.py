"""The tables. Each pipeline stage owns one: ingest writes events, passages and passage texts,
the judge writes judgments, judge runs and the label cache, scoring writes scores. Schema changes
go through Alembic (``service/store/migrations``); ``tests/integration/store/test_migrations.py``
checks the migrations build this schema.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy import text as sql_text
from sqlmodel import Field, SQLModel

# The tenant of every event sent without an API key (keys off), and of settings that name no tenant.
DEFAULT_TENANT = "default"
# The tenant of derived data (label cache rows) that every tenant shares, which a deployment asks
# for with ``share_derived_across_tenants``; no tenant is named so.
SHARED_SCOPE = ""


# An event's key and every column that refers to it: 64-bit on PostgreSQL, where the key carries
# the day the event was stored in its high bits (``service/store/partitions.py``); SQLite's
# INTEGER is 64-bit already and must stay spelled INTEGER to be the rowid.
EVENT_KEY = BigInteger().with_variant(Integer(), "sqlite")


def derived_scope(tenant: str, share_across_tenants: bool) -> str:
    """Under which tenant data derived from ``tenant``'s traffic is kept and looked up."""
    return SHARED_SCOPE if share_across_tenants else tenant


class EventStatus(StrEnum):
    PENDING = "pending"
    JUDGED = "judged"
    FAILED = "failed"
    SKIPPED = "skipped"  # not judged on purpose; skip_reason says why (unsampled, budget, shed)


class Event(SQLModel, table=True):
    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("tenant", "event_id", name="uq_events_tenant_event_id"),
        Index("ix_events_status_enqueued", "status", "enqueued_at"),
        Index("ix_events_received", "received_at"),
        Index("ix_events_status_received", "status", "received_at"),
        # The gold events of a window, of every tenant and of one (the judge's calibration,
        # refreshed every minute per process): partial, so finding the few gold events reads no
        # other event. The tenant's leads with the tenant: without statistics SQLite prefers any
        # index an equality on the tenant can use. A query uses them when it spells the
        # predicate as SQLAlchemy renders ``where(col(Event.gold))``.
        Index(
            "ix_events_gold_received",
            "received_at",
            sqlite_where=sql_text("gold = 1"),
            postgresql_where=sql_text("gold"),
        ),
        Index(
            "ix_events_gold_tenant_received",
            "tenant",
            "received_at",
            sqlite_where=sql_text("gold = 1"),
            postgresql_where=sql_text("gold"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True, sa_type=EVENT_KEY)
    tenant: str = Field(default=DEFAULT_TENANT, max_length=100)
    event_id: str = Field(max_length=200)
    payload_hash: str = Field(max_length=64)
    timestamp: datetime
    received_at: datetime
    app: str = Field(max_length=100)
    retriever: str = Field(max_length=100)
    environment: str = Field(default="", max_length=100)
    query: str = Field(sa_column=Column(Text, nullable=False))
    k: int
    passage_count: int
    candidates: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON))
    gold_passage_ids: list[str] | None = Field(default=None, sa_column=Column(JSON))
    # Whether gold_passage_ids holds ids: a non-gold event stores the JSON text null there,
    # which no index can tell from a list.
    gold: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    response: str | None = Field(default=None, sa_column=Column(Text))
    response_grade: int | None = None
    answer_correct: bool | None = None
    event_metadata: dict[str, Any] | None = Field(default=None, sa_column=Column("metadata", JSON))
    status: str = Field(default=EventStatus.PENDING, max_length=16)
    enqueued_at: datetime | None = None
    judged_at: datetime | None = None
    failure_reason: str | None = Field(default=None, max_length=500)
    skip_reason: str | None = Field(default=None, max_length=32)
    # 1 for gold events and events whose ingest signals look bad: judged first, never shed.
    priority: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # False for a narrow row (RM_KEEP_TEXTS=needed, an event nothing will judge): no query,
    # passages, candidates, response nor metadata were stored, only what identifies and counts it.
    texts_kept: bool = Field(default=True, sa_column_kwargs={"server_default": true()})


class Passage(SQLModel, table=True):
    """One ranked passage of one event: a reference to its text in ``passage_texts``.

    A retriever returns the same chunks to many queries, so the text is stored once per tenant
    and content hash; the event keeps its rank, the app's id, the score and the hash.
    ``text_released``: this event no longer needs the text (judged under hash-only storage, or
    past retention); the event then reads an empty text, and a text no event still needs is
    deleted (``service/store/passages.py``). The hash stays, as the label cache's key.
    """

    __tablename__ = "passages"
    __table_args__ = (
        PrimaryKeyConstraint("event_pk", "rank", name="pk_passages"),
        # Which events still need a text: the purge's one question, asked per hash. Partial,
        # so a released reference costs no index entry; keyed on the hash's first 16 hex digits
        # (64 bits, the full hash compared after), which made SQLite's ingest cheaper than the
        # whole hash did. A query uses it only when it spells the key the same way.
        Index(
            "ix_passages_live_hash",
            sql_text("substr(content_hash, 1, 16)"),
            sqlite_where=sql_text("NOT text_released"),
            postgresql_where=sql_text("NOT text_released"),
        ),
    )

    event_pk: int = Field(foreign_key="events.id", primary_key=True, sa_type=EVENT_KEY)
    rank: int = Field(primary_key=True)
    passage_id: str = Field(max_length=200)
    score: float | None = None
    content_hash: str = Field(max_length=64)
    text_released: bool = Field(default=False, sa_column_kwargs={"server_default": false()})


class PassageText(SQLModel, table=True):
    """A distinct passage text of a tenant and a day, stored once however many of that day's
    events refer to it.

    ``body``: the text in the form ``service.store.passage_body`` writes (one format byte, then
    its UTF-8, zlib-compressed when that is shorter); read it through ``read_passages``.
    ``day``: the day its events were stored, as their keys carry it (``event_pk >> 36``). On
    PostgreSQL a day's texts are a partition that leaves with the day's events, and a text a
    kept day refers to is that day's own copy (``service/store/partitions.py``); on SQLite every
    key is below ``1 << 36``, so every text is day 0 and is stored once.
    """

    __tablename__ = "passage_texts"
    __table_args__ = (
        PrimaryKeyConstraint("tenant", "content_hash", "day", name="pk_passage_texts"),
    )

    tenant: str = Field(max_length=100, primary_key=True)
    content_hash: str = Field(max_length=64, primary_key=True)
    day: int = Field(default=0, primary_key=True, sa_column_kwargs={"server_default": "0"})
    body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class Judgment(SQLModel, table=True):
    """One judge's grade of one passage of one event (grade None: the label is missing)."""

    __tablename__ = "judgments"
    __table_args__ = (
        UniqueConstraint(
            "event_pk", "rank", "judge", "prompt_version", name="uq_judgments_event_rank_judge"
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    event_pk: int = Field(foreign_key="events.id", index=True, sa_type=EVENT_KEY)
    rank: int
    judge: str = Field(max_length=100)
    model: str = Field(max_length=200)
    prompt_version: str = Field(max_length=50)
    grade: int | None = None
    relevant: bool | None = None
    from_cache: bool = False
    # The local judge's query-passage cosine, kept so the judge can be calibrated on gold
    # traffic without encoding anything again; None for an LLM judge or a cached label.
    similarity: float | None = None
    created_at: datetime


class JudgeRun(SQLModel, table=True):
    """What judging one event cost and gave beyond the per-passage grades."""

    __tablename__ = "judge_runs"
    __table_args__ = (
        UniqueConstraint("event_pk", "judge", "prompt_version", name="uq_judge_runs_event_judge"),
    )

    id: int | None = Field(default=None, primary_key=True)
    event_pk: int = Field(foreign_key="events.id", index=True, sa_type=EVENT_KEY)
    judge: str = Field(max_length=100)
    model: str = Field(max_length=200)
    prompt_version: str = Field(max_length=50)
    context_rating: int | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0
    missing_labels: int = 0
    malformed_replies: int = 0
    created_at: datetime


class LabelCache(SQLModel, table=True):
    """Grades already paid for, so a repeated (query, passage) pair costs no judge call.

    ``passage_hash`` is the passage's content hash, or ``ctx:<digest of the top-k hashes>`` for
    the context rating of a whole top-k list. ``tenant`` is the event's tenant, or the empty
    SHARED_SCOPE when the deployment shares derived data across tenants
    (``share_derived_across_tenants``).
    """

    __tablename__ = "label_cache"

    # Whose traffic the grade was derived from; SHARED_SCOPE when tenants share derived data.
    # First in the key, so every lookup is on the primary key's index.
    tenant: str = Field(primary_key=True, max_length=100)
    judge: str = Field(primary_key=True, max_length=100)
    model: str = Field(primary_key=True, max_length=200)
    prompt_version: str = Field(primary_key=True, max_length=50)
    query_hash: str = Field(primary_key=True, max_length=64)
    passage_hash: str = Field(primary_key=True, max_length=80)
    grade: int
    created_at: datetime


class Score(SQLModel, table=True):
    """The measures of one event under one judge and prompt version."""

    __tablename__ = "scores"
    __table_args__ = (
        UniqueConstraint("event_pk", "judge", "prompt_version", name="uq_scores_event_judge"),
    )

    id: int | None = Field(default=None, primary_key=True)
    event_pk: int = Field(foreign_key="events.id", index=True, sa_type=EVENT_KEY)
    judge: str = Field(max_length=100)
    prompt_version: str = Field(max_length=50)
    alpha: float
    np_window: int
    precision: float | None = None
    hit: float | None = None
    rr: float | None = None
    ndcg: float | None = None
    t: float | None = None
    t_u: float | None = None
    f_e: float | None = None
    context_relevance: float | None = None
    k_over_np_est: float | None = None
    recall: float | None = None
    f: float | None = None
    ndcg_gold: float | None = None
    created_at: datetime


class LocalJudgeCalibration(SQLModel, table=True):
    """Similarity thresholds fitted on a tenant's gold traffic and applied to the local judge.

    The newest row whose ``encoder_version`` matches a worker's encoder sets that worker's
    thresholds, and with them its prompt version, so labels under two calibrations never mix.
    """

    __tablename__ = "local_judge_calibrations"

    id: int | None = Field(default=None, primary_key=True)
    tenant: str = Field(max_length=100)
    encoder_version: str = Field(max_length=50)  # the prompt version stem, e.g. sim-v1
    thresholds: list[float] = Field(sa_column=Column(JSON, nullable=False))
    prompt_version: str = Field(max_length=50)
    fitted_queries: int
    held_out_queries: int
    held_out_kappa: float | None = None
    report: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    applied_at: datetime


class ApiKey(SQLModel, table=True):
    """An API key of a tenant. Only its SHA-256 is stored; the key is shown once, at creation."""

    __tablename__ = "api_keys"

    id: int | None = Field(default=None, primary_key=True)
    tenant: str = Field(max_length=100, index=True)
    name: str = Field(default="", max_length=200)
    key_hash: str = Field(max_length=64, unique=True)
    is_admin: bool = False
    created_at: datetime
    revoked_at: datetime | None = None


def table(model: type[SQLModel]) -> Table:
    """The Core table of a model, for bulk statements."""
    return SQLModel.metadata.tables[str(model.__tablename__)]


# --- what a person concluded about a gold miss (written by the pages) ---------------------------
# One current cause per event (the event is the primary key); recording again replaces it.
class MissCauseKind(StrEnum):
    VOCABULARY_MISMATCH = "vocabulary_mismatch"
    SPANS_PASSAGES = "spans_passages"
    NOT_IN_CORPUS = "not_in_corpus"
    AMBIGUOUS_QUESTION = "ambiguous_question"
    OTHER = "other"


MAX_NOTE_CHARS = 2000


class MissCause(SQLModel, table=True):
    __tablename__ = "miss_causes"

    event_pk: int = Field(foreign_key="events.id", primary_key=True, sa_type=EVENT_KEY)
    cause: str = Field(max_length=32)
    note: str | None = Field(default=None, sa_column=Column(Text))
    recorded_at: datetime


# --- gold marked by people after the fact (written by the gold API and the labelling page) ------
class GoldOutcome(StrEnum):
    """What a labeller concluded about an event's question."""

    ANSWERED = "answered"  # these passages (among the ones sent) answer it
    NOT_RETRIEVED = "not_retrieved"  # a passage that was not sent answers it (its id or text)
    NOT_IN_CORPUS = "not_in_corpus"  # nothing in the corpus answers it
    AMBIGUOUS = "ambiguous"  # the question is underspecified: no single answer to mark


class GoldLabel(SQLModel, table=True):
    """One labeller's gold for one event; labelling the event again replaces the row.

    ``passage_ids``: the answering passages (for ``not_retrieved`` the one that was not sent,
    its own id or an id derived from ``missing_text`` as ingest derives one); empty for the
    outcomes that mark no passage.
    """

    __tablename__ = "gold_labels"
    __table_args__ = (
        UniqueConstraint("event_pk", "labeller", name="uq_gold_labels_event_labeller"),
    )

    id: int | None = Field(default=None, primary_key=True)
    event_pk: int = Field(foreign_key="events.id", index=True, sa_type=EVENT_KEY)
    labeller: str = Field(max_length=200)
    labeller_name: str = Field(default="", max_length=200)
    outcome: str = Field(max_length=32)
    passage_ids: list[str] = Field(sa_column=Column(JSON, nullable=False))
    missing_text: str | None = Field(default=None, sa_column=Column(Text))
    answer_correct: bool | None = None
    labelled_at: datetime
