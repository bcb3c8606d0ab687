"""One-dimensional arrays in PostgreSQL's binary format, encoded for the driver in one call each.

Ingest sends each column of its rows as one array (``service/store/event_rows.py``). psycopg
finds an array's dumper from its elements on every statement (a fresh cursor knows none) and
walks the list in Python to size and dump it: about 5 us an array even for one element, some
180 us of a lone event's statement. Here each array is encoded by a function that knows its
element type, and handed to psycopg as bytes of a type whose dumper returns them as they are.

The encoding is PostgreSQL's own (``array_send``): the number of dimensions, whether any element
is NULL, the element type's oid, the length and lower bound, then each element as its length
(-1 for NULL) and its binary form. A list holding anything but the element type expected (or
None) is left as a list, for psycopg to dump as before: nothing a client sends is encoded here
that the server would read differently from psycopg's own array
(``tests/integration/store/test_binary_arrays.py`` reads both forms back through the server, and
the column-by-column test of ``event_rows`` compares the stored rows).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.adapt import Buffer, Dumper, PyFormat
from psycopg.pq import Format

_ARRAY_HEAD = struct.Struct(">iiIii")  # dimensions, has NULL, element oid, length, lower bound
_EMPTY_HEAD = struct.Struct(">iiI")  # no dimension: an empty array
_LENGTH = struct.Struct(">i").pack
_NULL = _LENGTH(-1)
_INT8 = struct.Struct(">iq").pack  # an element's length (8) and value
_FLOAT8 = struct.Struct(">id").pack
_TRUE = _LENGTH(1) + b"\x01"
_FALSE = _LENGTH(1) + b"\x00"
# timestamptz is sent as microseconds since 2000-01-01 UTC.
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

# Element oids, as PostgreSQL's catalog has them.
BOOL_OID = 16
BYTEA_OID = 17
INT8_OID = 20
TEXT_OID = 25
FLOAT8_OID = 701
TIMESTAMPTZ_OID = 1184


def arrays_usable(connection: psycopg.Connection[Any]) -> bool:
    """Whether arrays from ``encoded_array`` can be sent on ``connection``: its texts travel as
    UTF-8, as they are encoded here. Their dumpers are registered on the connection itself the
    first time, so they are there however the connection was made (without them psycopg would
    take an encoded array for ``bytea``, by its base class)."""
    if connection.info.encoding != "utf-8":
        return False
    adapters = connection.adapters
    if adapters.get_dumper(_PROBE, PyFormat.BINARY) is not _DUMPERS[_PROBE]:
        for encoded, dumper in _DUMPERS.items():
            adapters.register_dumper(encoded, dumper)
    return True


class _NotTheTypeError(Exception):
    """An element this encoder does not take: the list goes to psycopg as it is."""


def _text(value: object) -> bytes:
    if type(value) is not str:
        raise _NotTheTypeError
    try:
        encoded = value.encode()
    except UnicodeEncodeError:  # a lone surrogate: psycopg says how it refuses it
        raise _NotTheTypeError from None
    return _LENGTH(len(encoded)) + encoded


def _bytes(value: object) -> bytes:
    if type(value) is not bytes:
        raise _NotTheTypeError
    return _LENGTH(len(value)) + value


def _int8(value: object) -> bytes:
    if type(value) is not int or not -(2**63) <= value < 2**63:
        raise _NotTheTypeError  # psycopg sends a larger integer as numeric, and the cast refuses it
    return _INT8(8, value)


def _float8(value: object) -> bytes:
    if type(value) is not float:
        raise _NotTheTypeError
    return _FLOAT8(8, value)


def _bool(value: object) -> bytes:
    if type(value) is not bool:
        raise _NotTheTypeError
    return _TRUE if value else _FALSE


def _timestamptz(value: object) -> bytes:
    # A naive datetime is a timestamp without time zone to psycopg: left to it.
    if type(value) is not datetime or value.utcoffset() is None:
        raise _NotTheTypeError
    return _INT8(8, (value - _PG_EPOCH) // _MICROSECOND)


class EncodedArray(bytes):
    """An array already in PostgreSQL's binary format; each array type has a subclass, whose
    dumper sends it under that type's oid."""

    __slots__ = ()


class _AsIs(Dumper):
    """Hands an encoded array to the server as it is, under its array type's oid."""

    format = Format.BINARY

    def dump(self, obj: Any) -> Buffer:
        return obj  # type: ignore[no-any-return]


def _array_type(name: str, oid: int) -> tuple[type[EncodedArray], type[Dumper]]:
    """The encoded class of an array type, and its dumper."""
    encoded = type(name, (EncodedArray,), {"__slots__": ()})
    return encoded, type(f"{name}Dumper", (_AsIs,), {"oid": oid})


# By element oid: the encoded class of its array type and that class's dumper. Fixed here, at
# import: six entries.
_TYPES = {
    oid: _array_type(f"EncodedArray{oid}", array_oid)
    for oid, array_oid in (
        (BOOL_OID, 1000),
        (BYTEA_OID, 1001),
        (INT8_OID, 1016),
        (TEXT_OID, 1009),
        (FLOAT8_OID, 1022),
        (TIMESTAMPTZ_OID, 1185),
    )
}
_ARRAY_TYPES = {oid: encoded for oid, (encoded, _) in _TYPES.items()}
# Each encoded class's dumper, registered on a connection by ``arrays_usable``.
_DUMPERS = dict(_TYPES.values())
_PROBE = _ARRAY_TYPES[TEXT_OID]
_ELEMENTS: dict[int, Callable[[object], bytes]] = {
    BOOL_OID: _bool,
    BYTEA_OID: _bytes,
    INT8_OID: _int8,
    TEXT_OID: _text,
    FLOAT8_OID: _float8,
    TIMESTAMPTZ_OID: _timestamptz,
}


def column_array(values: list[Any], element_oid: int, encode: bool) -> EncodedArray | list[object]:
    """A column's values as the statement's parameter: encoded here when ``encode`` (the
    connection's ``arrays_usable``), else the list for psycopg."""
    return encoded_array(values, element_oid) if encode else values


def encoded_array(values: Sequence[object], element_oid: int) -> EncodedArray | list[object]:
    """``values`` as an array of ``element_oid`` in binary, or as a plain list when one of them
    is not of the element's type (psycopg then dumps it as it always did). Texts are encoded as
    UTF-8: only for a connection whose client encoding is UTF-8 (``arrays_usable``)."""
    element = _ELEMENTS[element_oid]
    array_type = _ARRAY_TYPES[element_oid]
    if not values:
        return array_type(_EMPTY_HEAD.pack(0, 0, element_oid))
    parts = [b""]
    has_null = 0
    try:
        for value in values:
            if value is None:
                has_null = 1
                parts.append(_NULL)
            else:
                parts.append(element(value))
    except _NotTheTypeError:
        return list(values)
    parts[0] = _ARRAY_HEAD.pack(1, has_null, element_oid, len(values), 1)
    return array_type(b"".join(parts))
