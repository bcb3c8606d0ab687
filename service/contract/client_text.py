"""The one gate of a client's free text: every string a request body carries is masked with the
serving application's ``Redactor`` as the body is validated.

A request runs inside ``redacting(redactor)`` (an ASGI middleware of the application opens it),
and ``StorableBody``, the base of every request body, masks each of its strings after its own
checks. A route added later takes its body as a ``StorableBody`` like every other, so its texts
are masked before any handler, store, log or judge sees them; texts that reach a route by another
way (a cookie, an API key's name) go through ``mask_text``, under the same redactor.

What is not free text stays as sent: a choice among fixed values (``Literal``, an enum) and a
field marked ``Verbatim`` (the client's own handle on an event). A masked string is cut back to
its field's ``max_length``, since a mask may be longer than what it hides.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import Enum
from typing import Annotated, Any, Literal, TypeVar

from annotated_types import MaxLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from service.contract.redaction import Redactor

Model = TypeVar("Model", bound=BaseModel)

# None outside a request (the command line, a test building a body by hand): nothing to mask.
_serving: ContextVar[Redactor | None] = ContextVar("client_text_redactor", default=None)


class Verbatim:
    """Marks a body field kept exactly as sent: an identifier the client looks its data up by,
    whose pattern admits nothing a redaction pattern masks."""


@contextmanager
def redacting(redactor: Redactor) -> Iterator[None]:
    """Every body validated and every ``mask_text`` called inside is masked with ``redactor``."""
    token = _serving.set(redactor)
    try:
        yield
    finally:
        _serving.reset(token)


def mask_text(text: str) -> str:
    """``text`` masked with the redactor of the request being served."""
    redactor = _serving.get()
    return redactor.redact(text) if redactor else text


def mask_body_in_place(body: BaseModel) -> None:
    """Mask every free text of ``body`` with the redactor of the request being served (none
    outside a request). In place: it runs as the body's own validator, which must return it."""
    redactor = _serving.get()
    if redactor:
        for name, value in _masked_fields(body, redactor).items():
            body.__dict__[name] = value


def mask_model(model: Model, redactor: Redactor) -> Model:
    """A copy of ``model`` with every free text masked, nested models and JSON values included."""
    return model.model_copy(update=_masked_fields(model, redactor))


def _masked_fields(model: BaseModel, redactor: Redactor) -> dict[str, Any]:
    return {
        name: _masked(getattr(model, name), field.annotation, field.metadata, redactor)
        for name, field in type(model).model_fields.items()
        if not _verbatim(field)
    }


def _verbatim(field: FieldInfo) -> bool:
    return any(isinstance(item, Verbatim) for item in field.metadata) or _is_choice(
        field.annotation
    )


def _is_choice(annotation: Any) -> bool:
    """Whether every value the annotation admits is one of a fixed set (no free text)."""
    for part in _alternatives(annotation):
        if part is type(None):
            continue
        if typing.get_origin(part) is Literal:
            continue
        if isinstance(part, type) and issubclass(part, Enum):
            continue
        return False
    return True


def _alternatives(annotation: Any) -> list[Any]:
    """The members of a union (``X | None``), each stripped of ``Annotated``."""
    annotation = _bare(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [_bare(arg) for arg in typing.get_args(annotation)]
    return [annotation]


def _bare(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _width(annotation: Any, metadata: list[Any]) -> int | None:
    """The ``max_length`` a string of this annotation is held to, if any."""
    found = [item.max_length for item in metadata if isinstance(item, MaxLen)]
    for part in [annotation, *typing.get_args(_bare_union(annotation))]:
        if typing.get_origin(part) is Annotated:
            for item in typing.get_args(part)[1:]:
                inner = item.metadata if isinstance(item, FieldInfo) else [item]
                found += [x.max_length for x in inner if isinstance(x, MaxLen)]
    return min(found) if found else None


def _bare_union(annotation: Any) -> Any:
    return annotation if typing.get_origin(annotation) in (typing.Union, types.UnionType) else None


def _item_annotation(annotation: Any) -> Any:
    """The annotation of a list's items (``list[X]`` or ``list[X] | None``), else Any."""
    for part in _alternatives(annotation):
        if typing.get_origin(part) is list:
            args = typing.get_args(part)
            return args[0] if args else Any
    return Any


def _masked(value: Any, annotation: Any, metadata: list[Any], redactor: Redactor) -> Any:
    if isinstance(value, str):
        masked = redactor.redact(value)
        width = _width(annotation, metadata)
        return masked if width is None else masked[:width]
    if isinstance(value, BaseModel):
        return mask_model(value, redactor)
    if isinstance(value, list):
        # The list's own max_length counts its items; each item keeps its own width.
        item = _item_annotation(annotation)
        return [_masked(entry, item, [], redactor) for entry in value]
    if isinstance(value, dict):
        return redactor.redact_json(value)
    return value
