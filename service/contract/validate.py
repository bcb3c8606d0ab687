"""The first step of an event's way: the body checked against the schema and the limits.

What passes is handed to ``redact`` and comes back with its free text masked; what fails
becomes a ``Rejection``, which the caller answers and counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from service.config.settings import Settings
from service.contract.redact import redact_event
from service.contract.redaction import Redactor
from service.contract.schemas import EventIn, check_limits
from service.contract.validation_errors import breaks_a_count_limit, errors_summary


@dataclass(frozen=True)
class Rejection:
    event_id: str | None
    reason: str  # a bounded metric label: invalid, empty_retrieval, limits, conflict
    message: str
    empty_retrieval: dict[str, str] | None = None  # its labels, when no passage was sent


def validate(
    raw: dict[str, Any] | EventIn, settings: Settings, redactor: Redactor
) -> EventIn | Rejection:
    claimed = raw.get("event_id") if isinstance(raw, dict) else raw.event_id
    event_id = claimed if isinstance(claimed, str) else None
    try:
        event = raw if isinstance(raw, EventIn) else EventIn.model_validate(raw)
    except ValidationError as exc:
        failures = exc.errors(include_url=False)
        message = errors_summary(failures, empty_loc="body")
        if breaks_a_count_limit(failures):
            return Rejection(event_id, "limits", message)
        empty = empty_retrieval_labels(raw)
        return Rejection(event_id, "empty_retrieval" if empty else "invalid", message, empty)
    problems = check_limits(event, settings)
    if problems:
        return Rejection(event_id, "limits", "; ".join(problems))
    return redact_event(event, redactor)


def empty_retrieval_labels(raw: object) -> dict[str, str] | None:
    """The labels of a body that reports a retrieval with no passage at all, else None.

    The v1 contract refuses such an event (there is nothing to judge), but a retriever returning
    nothing is exactly what the empty-retrieval signal and its alert watch for, so it is counted.
    """
    if not isinstance(raw, dict) or raw.get("passages") != []:
        return None
    labels = {name: raw.get(name) for name in ("app", "retriever", "environment")}
    if not isinstance(labels["app"], str) or not isinstance(labels["retriever"], str):
        return None
    limit = 100
    return {k: v[:limit] if isinstance(v, str) else "" for k, v in labels.items()}
