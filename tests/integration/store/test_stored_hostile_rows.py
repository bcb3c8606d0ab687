"""Rows stored before the storable check: a NUL or a lone surrogate in any text or JSON column.

An older version accepted such values, so a database may hold them. Each is written here with
SQL, bypassing the API, in the form that store really keeps: escapes (``\\u0000``, ``\\ud800``)
in the JSON columns of both stores, and raw bytes (a NUL, a surrogate's UTF-8-like encoding) in
SQLite's text columns (PostgreSQL refuses both in text). A passage text is stored as bytes
(``service.store.passage_body``), plain or compressed, which can hold the same bytes on both
stores. Every read of the event then answers 200, and the migrations rewrite each such value
with U+FFFD, leaving every row in place: 0008 in the text and JSON columns, 0006 in the passage
texts it compresses.

Tests ``service.store.readable``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import Connection, Engine, LargeBinary, create_engine, inspect, text

from service.api.app import create_app
from service.store.engine import make_engine, session_scope
from service.store.migrate import alembic_config, upgrade
from service.store.passage_body import PLAIN, ZLIB
from service.store.passages import read_passages
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.reads import assert_everything_reads

REPLACEMENT = "\ufffd"
BEFORE_CLEANING = "0005"
# The raw UTF-8-like encoding of U+D800, which no UTF-8 decoder accepts.
SURROGATE_BYTES = b"\xed\xa0\x80"
JSON_COLUMNS = {"events": ("gold_passage_ids", "metadata", "candidates")}
SQLITE_TEXT_CELLS = (
    ("events", "query"),
    ("events", "environment"),
    ("events", "response"),
    ("passages", "passage_id"),
)
# An old version's passage text, as raw bytes.
HOSTILE_PASSAGE = b"old \x00 value " + SURROGATE_BYTES + b" text"


def hostile_json() -> dict[str, str]:
    """JSON texts an old version stored: ``json.dumps`` escapes NUL and lone surrogates."""
    return {
        "gold_passage_ids": json.dumps(["d1", "g\x00old", "\ud800"]),
        "metadata": json.dumps({"team\x00": "x\udfff", "nested": {"k": ["\x00"]}}),
        "candidates": json.dumps([{"id": "c\x00\ud800", "score": 1.0}]),
    }


@pytest.fixture
def client(tmp_path: Path, store_url: str, redis_url: str) -> Iterator[TestClient]:
    settings = make_settings(tmp_path, store_url, redis_url)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def store_events(client: TestClient) -> None:
    """One clean event and one that the SQL below makes hostile, both gold and with feedback."""
    for event_id in ("clean", "hostile"):
        event = make_event(
            event_id,
            gold_passage_ids=["d1"],
            metadata={"team": "a"},
            candidates=[{"id": "c1", "score": 1.0}],
        )
        assert client.post("/v1/events", json=event).status_code == 202
        feedback = {"response": "an answer", "response_grade": 2}
        assert client.post(f"/v1/events/{event_id}/feedback", json=feedback).status_code == 200


def make_hostile(engine: Engine) -> None:
    """Write the values an old version could have stored into the event ``hostile``."""
    with engine.begin() as conn:
        pk = conn.execute(text("SELECT id FROM events WHERE event_id = 'hostile'")).scalar_one()
        for column, value in hostile_json().items():
            target = f"CAST(:value AS {'json' if conn.dialect.name == 'postgresql' else 'TEXT'})"
            conn.execute(
                text(f'UPDATE events SET "{column}" = {target} WHERE id = :pk'),
                {"value": value, "pk": pk},
            )
        columns = {c["name"] for c in inspect(conn).get_columns("passages")}
        if "text" not in columns:  # the passage store: a body of bytes on both stores
            make_hostile_passage_bodies(conn, pk)
        if conn.dialect.name != "sqlite":
            return
        cells = SQLITE_TEXT_CELLS + ((("passages", "text"),) if "text" in columns else ())
        for table, column in cells:
            key = "id" if table == "events" else "event_pk"
            raw = HOSTILE_PASSAGE if column == "text" else b"old \x00 value " + SURROGATE_BYTES
            conn.execute(
                text(f"UPDATE {table} SET {column} = CAST(:raw AS TEXT) WHERE {key} = :pk"),
                {"raw": raw + (b"" if column == "text" else b" " + column.encode()), "pk": pk},
            )


def make_hostile_passage_bodies(conn: Connection, pk: int) -> None:
    """The event's first passage text compressed, its second plain, both the old bytes."""
    hashes = conn.execute(
        text("SELECT content_hash FROM passages WHERE event_pk = :pk ORDER BY rank LIMIT 2"),
        {"pk": pk},
    ).scalars()
    for digest, body in zip(
        hashes, (ZLIB + zlib.compress(HOSTILE_PASSAGE), PLAIN + HOSTILE_PASSAGE), strict=True
    ):
        conn.execute(
            text("UPDATE passage_texts SET body = :body WHERE content_hash = :digest"),
            {"body": body, "digest": digest},
        )


def passage_texts(store_url: str, event_id: str) -> list[str]:
    """The event's passage texts in rank order, as the service reads them."""
    engine = make_engine(store_url)
    try:
        with session_scope(engine) as session:
            pk = session.execute(
                text("SELECT id FROM events WHERE event_id = :id"), {"id": event_id}
            ).scalar_one()
            return [p.text for p in read_passages(session, [pk])[pk]]
    finally:
        engine.dispose()


def unclean_cells(engine: Engine) -> list[tuple[str, str]]:
    """(table, column) of every stored value that still holds a NUL or a lone surrogate."""
    found: list[tuple[str, str]] = []
    with engine.connect() as conn:
        for table in inspect(conn).get_table_names():
            for column in inspect(conn).get_columns(table):
                name = column["name"]
                if isinstance(column["type"], LargeBinary):
                    # Bytes, not text: what matters is the text they hold.
                    bodies = conn.execute(text(f'SELECT "{name}" FROM {table}')).scalars()
                    if any(not _clean_utf8(_passage_text(bytes(b))) for b in bodies):
                        found.append((table, name))
                elif conn.dialect.name == "sqlite":
                    cells = conn.execute(text(f'SELECT CAST("{name}" AS BLOB) FROM {table}'))
                    raw = [c for (c,) in cells if isinstance(c, bytes)]
                    if any(not _clean_utf8(c) for c in raw):
                        found.append((table, name))
                if name in JSON_COLUMNS.get(table, ()):
                    texts = conn.execute(text(f'SELECT CAST("{name}" AS TEXT) FROM {table}'))
                    if any(_json_unclean(t) for (t,) in texts if t is not None):
                        found.append((table, name))
    return found


def _clean_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in raw


def _passage_text(body: bytes) -> bytes:
    """The bytes of the text a passage body holds, decoded without any repair."""
    return zlib.decompress(body[1:]) if body[:1] == ZLIB else body[1:]


def _json_unclean(document: str) -> bool:
    def walk(value: Any) -> bool:
        if isinstance(value, str):
            return "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value)
        if isinstance(value, dict):
            return any(walk(k) or walk(v) for k, v in value.items())
        if isinstance(value, list):
            return any(walk(v) for v in value)
        return False

    return walk(json.loads(document))


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            table: conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in ("events", "passages", "judgments", "scores", "miss_causes")
        }


def test_every_read_of_an_old_hostile_row_answers_200(client: TestClient, store_url: str) -> None:
    store_events(client)
    engine = create_engine(store_url)
    try:
        make_hostile(engine)
        # The rows really hold what an old version stored.
        assert ("passage_texts", "body") in unclean_cells(engine)
        assert_everything_reads(client, {"clean", "hostile"})
        body = client.get("/v1/events/hostile").json()
    finally:
        engine.dispose()
    # What cannot be shown is shown as U+FFFD, the rest as stored.
    assert body["gold_passage_ids"] == ["d1", f"g{REPLACEMENT}old", REPLACEMENT]
    if store_url.startswith("sqlite"):
        assert body["query"].startswith(f"old {REPLACEMENT} value {REPLACEMENT}")
    # The compressed passage and the plain one alike.
    assert (
        passage_texts(store_url, "hostile")[:2]
        == [f"old {REPLACEMENT} value {REPLACEMENT * 3} text"] * 2
    )


def test_migration_0008_rewrites_hostile_values_and_keeps_every_row(
    client: TestClient, store_url: str
) -> None:
    store_events(client)
    engine = create_engine(store_url)
    config = alembic_config(store_url)
    try:
        # The database as an old version left it: before the cleaning, with hostile rows.
        command.downgrade(config, BEFORE_CLEANING)
        make_hostile(engine)
        before = counts(engine)
        unclean = unclean_cells(engine)
        assert ("events", "gold_passage_ids") in unclean
        if store_url.startswith("sqlite"):
            assert ("passages", "text") in unclean
        upgrade(store_url)
        # Every passage body too holds clean text: 0006 cleaned each text it compressed.
        assert unclean_cells(engine) == []
        assert counts(engine) == before
        if store_url.startswith("sqlite"):
            text_read = passage_texts(store_url, "hostile")[0]
            assert text_read == f"old {REPLACEMENT} value {REPLACEMENT * 3} text"
        with engine.connect() as conn:
            gold = conn.execute(
                text("SELECT CAST(gold_passage_ids AS TEXT) FROM events WHERE event_id = 'hostile'")
            ).scalar_one()
        assert json.loads(gold) == ["d1", f"g{REPLACEMENT}old", REPLACEMENT]
        # A second run finds nothing left to rewrite, and the clean event is untouched.
        command.downgrade(config, BEFORE_CLEANING)
        upgrade(store_url)
        assert counts(engine) == before
        assert client.get("/v1/events/clean").json()["gold_passage_ids"] == ["d1"]
        assert_everything_reads(client, {"clean", "hostile"})
    finally:
        engine.dispose()
