"""Reading back what an older version stored: text and JSON that no longer pass the storable
check (``service.contract.storable``) but may still sit in a database.

Before that check, a NUL or a lone surrogate could reach the JSON columns of both stores as an
escape (``\\u0000``, ``\\ud800``), and SQLite's text columns as raw bytes that are not UTF-8.
Read as they are, such values fail the read itself (SQLite cannot decode them), a later query
(PostgreSQL refuses a NUL as a parameter), or the answer (a JSON body cannot carry a lone
surrogate), so one row would fail every page that lists it. The engine reads every value through
these functions instead: each such character comes back as U+FFFD, the rest as stored.
Migration 0008 rewrites the stored values the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any

REPLACEMENT = "\ufffd"
# A NUL or a code point of the surrogate range: in a Python str every such code point is lone,
# since a valid pair decodes into one astral character.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# The escapes that decode into one of them; a document without any needs no walk.
_UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def readable(value: str) -> str:
    """``value`` with each NUL and lone surrogate replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, value)


def readable_text(raw: bytes) -> str:
    """SQLite's text factory: bytes that are not UTF-8, and NULs, come back as U+FFFD."""
    text = raw.decode("utf-8", "replace")
    return readable(text) if "\x00" in text else text


def readable_value(value: Any) -> Any:
    """A decoded JSON value with ``readable`` applied to every string, keys included."""
    if isinstance(value, str):
        return readable(value)
    if isinstance(value, list):
        return [readable_value(item) for item in value]
    if isinstance(value, dict):
        return {readable(key): readable_value(item) for key, item in value.items()}
    return value


def readable_json(document: str | bytes) -> Any:
    """The engine's JSON deserializer: ``json.loads``, then ``readable_value`` when the
    document holds an escape of a NUL or a surrogate (psycopg hands over bytes, SQLite a str)."""
    if isinstance(document, bytes):
        document = document.decode("utf-8", "replace")
    value = json.loads(document)
    if _UNSTORABLE_ESCAPE.search(document) or "\x00" in document:
        return readable_value(value)
    return value
