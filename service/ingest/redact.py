"""The second step of an event's way: every free text of a valid event masked.

The ``Redactor`` (what is masked, and how) is the kernel's; this module applies it to each field
of an event, so every later step only ever sees the masked copy.
"""

from __future__ import annotations

from typing import Any

from service.kernel.redaction import Redactor
from service.kernel.schemas import MAX_ID_CHARS, MAX_LABEL_COLUMN_CHARS, EventIn


def redact_event(event: EventIn, redactor: Redactor) -> EventIn:
    """The event with every free text masked; every later stage only ever sees this copy.

    Ids and labels are masked too (an email makes a fine passage id), and cut back to their
    column's width should a mask be longer than what it hides. The event_id is the exception:
    it is the client's handle on the event, and its pattern admits no "@" or space.
    """
    if not redactor:
        return event

    def text(value: str) -> str:
        return redactor.redact(value)

    def ident(value: str, width: int = MAX_ID_CHARS) -> str:
        return redactor.redact(value)[:width]

    def label(value: str | None) -> str | None:
        return None if value is None else ident(value, MAX_LABEL_COLUMN_CHARS)

    update: dict[str, Any] = {
        "app": label(event.app),
        "retriever": label(event.retriever),
        "environment": label(event.environment),
        "query": text(event.query),
        "passages": [
            p.model_copy(update={"text": text(p.text), "id": None if p.id is None else ident(p.id)})
            for p in event.passages
        ],
        "response": None if event.response is None else text(event.response),
        "metadata": redactor.redact_json(event.metadata),
    }
    if event.candidates is not None:
        update["candidates"] = [c.model_copy(update={"id": ident(c.id)}) for c in event.candidates]
    if event.gold_passage_ids is not None:
        update["gold_passage_ids"] = [ident(g) for g in event.gold_passage_ids]
    return event.model_copy(update=update)
