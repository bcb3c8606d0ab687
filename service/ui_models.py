"""What a person concluded about a gold miss: why the gold passage did not reach the prompt.

One current cause per event (the event is the primary key); recording again replaces it. Counting
misses by cause tells which fix to work on next (a synonym list, a bigger chunk, a corpus gap).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import Column, Text
from sqlmodel import Field, SQLModel


class MissCauseKind(StrEnum):
    VOCABULARY_MISMATCH = "vocabulary_mismatch"
    SPANS_PASSAGES = "spans_passages"
    NOT_IN_CORPUS = "not_in_corpus"
    AMBIGUOUS_QUESTION = "ambiguous_question"
    OTHER = "other"


MISS_CAUSE_TITLES: dict[MissCauseKind, str] = {
    MissCauseKind.VOCABULARY_MISMATCH: "Vocabulary mismatch",
    MissCauseKind.SPANS_PASSAGES: "Answer spans two passages",
    MissCauseKind.NOT_IN_CORPUS: "Document not in the corpus",
    MissCauseKind.AMBIGUOUS_QUESTION: "Ambiguous question",
    MissCauseKind.OTHER: "Other",
}

MAX_NOTE_CHARS = 2000


class MissCause(SQLModel, table=True):
    __tablename__ = "miss_causes"

    event_pk: int = Field(foreign_key="events.id", primary_key=True)
    cause: str = Field(max_length=32)
    note: str | None = Field(default=None, sa_column=Column(Text))
    recorded_at: datetime
