"""Every list of a request body is counted against its limit before one of its items is
validated.

Validation is where an item costs: a ``{}`` among the passages becomes two errors of about a
kilobyte each. The operator's limits (``max_passages``, ``max_batch_events`` ...) are settings,
so they cannot be written into the models; a list field names its setting with ``CountLimit``
instead, and ``CountedBody``, the base of every request body, compares the raw list's length with
it before pydantic looks inside. A request runs inside ``counting(settings)`` (an ASGI middleware
of the application opens it); outside one (the command line, a test building a body by hand)
nothing is counted here and ``check_limits`` says the same later.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, model_validator
from pydantic_core import PydanticCustomError

from service.config.settings import Settings

# The error type a refused count carries, so that it is counted as a broken limit, not as a
# malformed body.
TOO_MANY_ITEMS = "too_many_items"

_serving: ContextVar[Settings | None] = ContextVar("count_limits_settings", default=None)


@dataclass(frozen=True)
class CountLimit:
    """Marks a list field: at most ``settings.<setting>`` items, said as ``too many <noun>``."""

    setting: str
    noun: str


@contextmanager
def counting(settings: Settings) -> Iterator[None]:
    """Every body validated inside has its lists counted against ``settings``."""
    token = _serving.set(settings)
    try:
        yield
    finally:
        _serving.reset(token)


class CountedBody(BaseModel):
    """A request body whose ``CountLimit`` lists are counted before their items are read."""

    # field name -> its limit, gathered once per class rather than per body
    count_limits: ClassVar[dict[str, CountLimit]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.count_limits = {
            name: limit
            for name, field in cls.model_fields.items()
            for limit in field.metadata
            if isinstance(limit, CountLimit)
        }

    @model_validator(mode="before")
    @classmethod
    def lists_within_their_limits(cls, data: Any) -> Any:
        settings = _serving.get()
        if settings is not None and cls.count_limits and isinstance(data, dict):
            check_counts(cls.count_limits, data, settings)
        return data


def check_counts(limits: dict[str, CountLimit], data: dict[str, Any], settings: Settings) -> None:
    """Raise a ``too_many_items`` error, naming the limit, for the first list of ``data`` longer
    than its own."""
    for name, limit in limits.items():
        value = data.get(name)
        most = getattr(settings, limit.setting)
        if isinstance(value, list) and len(value) > most:
            raise PydanticCustomError(
                TOO_MANY_ITEMS,
                "too many {noun}: {count} > {setting} {most}",
                {"noun": limit.noun, "count": len(value), "setting": limit.setting, "most": most},
            )
