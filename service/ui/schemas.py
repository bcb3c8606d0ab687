"""The JSON bodies of the miss-cause API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, model_validator

from service.contract.schemas import StorableBody
from service.store.models import MAX_NOTE_CHARS, MissCauseKind


class MissCauseIn(StorableBody):
    """A store keeps the note as it came: no NUL, no lone surrogate (``StorableBody``)."""

    cause: MissCauseKind = Field(description="Why the gold passage did not reach the prompt.")
    note: str | None = Field(
        None, max_length=MAX_NOTE_CHARS, description="Free text; required when cause is other."
    )

    @model_validator(mode="after")
    def _other_needs_a_note(self) -> MissCauseIn:
        self.note = self.note.strip() if self.note and self.note.strip() else None
        if self.cause is MissCauseKind.OTHER and self.note is None:
            raise ValueError("cause 'other' needs a note saying what the cause was")
        return self


class MissCauseView(BaseModel):
    event_id: str
    cause: MissCauseKind
    note: str | None
    recorded_at: datetime


class CauseCountsView(BaseModel):
    gold_events: int = Field(description="Events with gold passage ids in the window.")
    misses: int = Field(description="Gold events none of whose gold passages reached the prompt.")
    classified: int
    unclassified: int
    causes: dict[MissCauseKind, int] = Field(description="Misses per recorded cause.")
