"""Arrays encoded by ``binary_arrays`` are read by PostgreSQL as the arrays psycopg makes of the
same lists: for every element type ingest sends, over drawn values with NULLs, empty lists,
every code point a store keeps, float edges and time zones; and a list the encoder does not
take is handed back as it is, for psycopg to send."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from service.store.binary_arrays import (
    BOOL_OID,
    BYTEA_OID,
    FLOAT8_OID,
    INT8_OID,
    TEXT_OID,
    TIMESTAMPTZ_OID,
    EncodedArray,
    arrays_usable,
    encoded_array,
)

# The SQL type each element type is cast to, as the ingest statements cast the arrays.
CASTS = {
    BOOL_OID: "boolean[]",
    BYTEA_OID: "bytea[]",
    INT8_OID: "integer[]",
    TEXT_OID: "varchar[]",
    FLOAT8_OID: "float8[]",
    TIMESTAMPTZ_OID: "timestamptz[]",
}
KEPT_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
ELEMENTS: dict[int, st.SearchStrategy[Any]] = {
    BOOL_OID: st.booleans(),
    BYTEA_OID: st.binary(),
    INT8_OID: st.integers(-(2**31), 2**31 - 1),
    TEXT_OID: KEPT_TEXT,
    FLOAT8_OID: st.floats(allow_nan=False),
    TIMESTAMPTZ_OID: st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=OFFSETS
    ),
}


@pytest.fixture(scope="module")
def connection(postgres_server_url: str) -> Iterator[psycopg.Connection[Any]]:
    url = make_url(postgres_server_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname=url.database, autocommit=True
    ) as conn:
        assert arrays_usable(conn)  # which registers the encoded arrays' dumpers
        yield conn


def _read_back(conn: psycopg.Connection[Any], value: object, cast: str) -> Any:
    """The array as the server reads the parameter, and its text form (exact for floats)."""
    row = conn.execute(f"SELECT %b::{cast}, (%b::{cast})::text", [value, value]).fetchone()
    assert row is not None
    return tuple(row)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.data())
def test_an_encoded_array_reads_back_as_the_list_psycopg_sends(
    connection: psycopg.Connection[Any], data: st.DataObject
) -> None:
    oid = data.draw(st.sampled_from(sorted(ELEMENTS)))
    values = data.draw(st.lists(st.one_of(st.none(), ELEMENTS[oid]), max_size=6))
    encoded = encoded_array(values, oid)
    assert isinstance(encoded, EncodedArray)
    if not any(value is not None for value in values):
        # psycopg cannot tell an element type from NULLs alone: compared with the values.
        assert _read_back(connection, encoded, CASTS[oid])[0] == (values or [])
        return
    assert _read_back(connection, encoded, CASTS[oid]) == _read_back(connection, values, CASTS[oid])


def test_float_edges_and_distant_moments_read_back_exactly(
    connection: psycopg.Connection[Any],
) -> None:
    floats = [0.0, -0.0, float("inf"), float("-inf"), 5e-324, 1.7976931348623157e308]
    moments = [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2199, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-14))),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),  # before PostgreSQL's epoch
    ]
    for values, oid in ((floats, FLOAT8_OID), (moments, TIMESTAMPTZ_OID)):
        encoded = encoded_array(values, oid)
        assert isinstance(encoded, EncodedArray)
        assert _read_back(connection, encoded, CASTS[oid]) == _read_back(
            connection, values, CASTS[oid]
        )
    nan = encoded_array([float("nan")], FLOAT8_OID)
    assert _read_back(connection, nan, "float8[]")[1] == "{NaN}"


@pytest.mark.parametrize(
    ("values", "oid"),
    [
        (["a", 1], TEXT_OID),  # a value of another type
        (["\ud800"], TEXT_OID),  # a lone surrogate: psycopg says how it refuses it
        ([1, 2**63], INT8_OID),  # past 64 bits: psycopg sends numeric
        ([True], INT8_OID),  # a bool is not an integer here
        ([1], FLOAT8_OID),  # an int in a float column
        ([datetime(2026, 1, 1)], TIMESTAMPTZ_OID),  # naive: a timestamp without time zone
        ([bytearray(b"x")], BYTEA_OID),
    ],
)
def test_a_list_the_encoder_does_not_take_is_handed_back_as_it_is(
    values: list[object], oid: int
) -> None:
    handed_back = encoded_array(values, oid)
    assert not isinstance(handed_back, EncodedArray)
    assert handed_back == values


def test_a_connection_gets_the_dumpers_however_it_was_made(postgres_server_url: str) -> None:
    # Without them psycopg would send an encoded array as bytea, by its base class.
    url = make_url(postgres_server_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname=url.database
    ) as conn:
        encoded = encoded_array(["a"], TEXT_OID)
        with pytest.raises(psycopg.errors.CannotCoerce):
            conn.execute("SELECT %b::varchar[]", [encoded])
        conn.rollback()
        assert arrays_usable(conn)
        assert conn.execute("SELECT %b::varchar[]", [encoded]).fetchone() == (["a"],)
