"""The second step of an event's way: every free text of a valid event masked.

An event is a request body like any other and is masked by the same walk
(``service/contract/client_text.py``), only here rather than at validation: the limits of the first
step are measured on the text as sent. Every later step only ever sees the masked copy.
"""

from __future__ import annotations

from service.contract.client_text import mask_model
from service.contract.redaction import Redactor
from service.contract.schemas import EventIn


def redact_event(event: EventIn, redactor: Redactor) -> EventIn:
    """The event with every free text masked; every later stage only ever sees this copy.

    Ids and labels are masked too (an email makes a fine passage id), and cut back to their
    field's width should a mask be longer than what it hides. The event_id is the exception:
    it is the client's handle on the event, and its pattern admits no "@" or space.
    """
    if not redactor:
        return event
    return mask_model(event, redactor)
