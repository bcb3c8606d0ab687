"""The passage store: a text stored once per tenant however many events send it, read back by
each event as its own, released by hash-only storage and retention without breaking a read, and
safe against an ingest of the same text while a purge deletes it.

Tests ``service.store.passages`` and ``service.primitives.hashing``.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, func, select, text, update
from sqlmodel import col

from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.primitives.hashing import text_hash
from service.store.engine import make_engine, session_scope
from service.store.events import insert_events, stored_event
from service.store.judging import erase_passage_texts, load_many_for_judging, purge_texts
from service.store.models import Event, EventStatus, PassageText
from service.store.passage_body import PLAIN, ZLIB
from service.store.passages import read_passages
from tests.support.database import blocked_on_a_lock
from tests.support.live import wait_for

CORPUS = [f"abstract {i}: a passage a retriever returns to many queries" for i in range(6)]


def _event(event_id: str, texts: list[str], with_ids: bool = True) -> EventIn:
    return EventIn.model_validate(
        {
            "app": "rag",
            "retriever": "bm25",
            "query": f"question {event_id}",
            "k": min(2, len(texts)),
            "passages": [
                {"id": f"doc-{CORPUS.index(t)}" if with_ids else None, "text": t, "score": 1.0}
                for t in texts
            ],
        }
    )


def _insert(
    engine: Engine, tenant: str, events: dict[str, list[str]], with_ids: bool = True
) -> dict[str, int]:
    batch = [(eid, _event(eid, texts, with_ids)) for eid, texts in events.items()]
    with session_scope(engine) as session:
        results = insert_events(session, tenant, batch, utcnow())
        session.commit()
    return {r.event_id: r.pk for r in results if r.pk is not None}


def _texts_of(engine: Engine, pks: dict[str, int]) -> dict[str, list[str]]:
    with session_scope(engine) as session:
        found = read_passages(session, list(pks.values()))
    return {eid: [p.text for p in found.get(pk, [])] for eid, pk in pks.items()}


def _stored_texts(engine: Engine) -> int:
    with session_scope(engine) as session:
        return int(session.execute(select(func.count()).select_from(PassageText)).scalar_one())


def test_a_text_is_stored_once_per_tenant_and_read_by_every_event(store_url: str) -> None:
    engine = make_engine(store_url)
    first = _insert(engine, "t1", {"a": CORPUS[0:3], "b": CORPUS[1:4]})
    # A later commit group sending known texts again, one of them twice in one event (without
    # ids, so each gets the id derived from its hash).
    second = _insert(engine, "t1", {"c": [CORPUS[2], CORPUS[0], CORPUS[2]]}, with_ids=False)
    other = _insert(engine, "t2", {"a": CORPUS[0:2]})
    assert _stored_texts(engine) == 4 + 2  # t1: CORPUS[0:4]; t2 its own copies of two
    assert _texts_of(engine, first | second) == {
        "a": CORPUS[0:3],
        "b": CORPUS[1:4],
        "c": [CORPUS[2], CORPUS[0], CORPUS[2]],
    }
    assert _texts_of(engine, other) == {"a": CORPUS[0:2]}
    with session_scope(engine) as session:
        # The judge reads the top 2k through the same store, with the hashes it keys labels on.
        (loaded,) = load_many_for_judging(session, [second["c"]])
        row = session.get(Event, second["c"])
        assert row is not None
        shown = stored_event(session, row)
    assert [(p.rank, p.text, p.content_hash) for p in loaded.passages] == [
        (1, CORPUS[2], text_hash(CORPUS[2])),
        (2, CORPUS[0], text_hash(CORPUS[0])),
        (3, CORPUS[2], text_hash(CORPUS[2])),
    ]
    derived = {t: f"sha256:{text_hash(t)[:16]}" for t in CORPUS}
    assert [(p.passage_id, p.text) for p in shown.passages] == [
        (derived[CORPUS[2]], CORPUS[2]),
        (derived[CORPUS[0]], CORPUS[0]),
        (derived[CORPUS[2]], CORPUS[2]),
    ]
    engine.dispose()


def test_hash_only_storage_drops_a_text_once_no_unjudged_event_needs_it(store_url: str) -> None:
    engine = make_engine(store_url)
    pks = _insert(engine, "t1", {"judged": CORPUS[0:2], "waiting": CORPUS[1:3]})
    with session_scope(engine) as session:
        erase_passage_texts(session, [pks["judged"]])
        session.commit()
    # The judged event reads empty texts; the shared text stays for the event still waiting.
    assert _texts_of(engine, pks) == {"judged": ["", ""], "waiting": CORPUS[1:3]}
    assert _stored_texts(engine) == 2
    with session_scope(engine) as session:
        erase_passage_texts(session, [pks["waiting"]])
        session.commit()
    assert _texts_of(engine, pks) == {"judged": ["", ""], "waiting": ["", ""]}
    assert _stored_texts(engine) == 0
    with session_scope(engine) as session:
        hashes = [p.content_hash for p in read_passages(session, [pks["waiting"]])[pks["waiting"]]]
    assert hashes == [text_hash(t) for t in CORPUS[1:3]]  # the hashes stay
    engine.dispose()


def test_retention_purges_a_text_no_retained_or_pending_event_refers_to(store_url: str) -> None:
    engine = make_engine(store_url)
    pks = _insert(
        engine,
        "t1",
        {"old": CORPUS[0:3], "old-pending": [CORPUS[2]], "recent": [CORPUS[1]]},
    )
    now = utcnow()
    with session_scope(engine) as session:
        old = [pks["old"], pks["old-pending"]]
        session.execute(
            update(Event).where(col(Event.id).in_(old)).values(received_at=now - timedelta(days=9))
        )
        session.execute(
            update(Event)
            .where(col(Event.id).in_([pks["old"], pks["recent"]]))
            .values(status=EventStatus.JUDGED.value)
        )
        session.commit()
    with session_scope(engine) as session:
        assert purge_texts(session, now - timedelta(days=1), limit=100) == 1
        session.commit()
    # CORPUS[0] only the purged event needed; CORPUS[1] the recent one and CORPUS[2] the pending
    # one (old, but not judged yet) still do.
    assert _texts_of(engine, pks) == {
        "old": ["", "", ""],
        "old-pending": [CORPUS[2]],
        "recent": [CORPUS[1]],
    }
    assert _stored_texts(engine) == 2
    engine.dispose()


# --- the race: an ingest referring to a text while a purge deletes it (PostgreSQL) ---------------
# SQLite lets one writer at a time in; PostgreSQL lets both run, and the lock must order them.


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_a_purge_waits_for_an_ingest_referring_to_the_text(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    pks = _insert(engine, "t1", {"old": [CORPUS[0]]})
    with session_scope(engine) as ingest:
        # The ingest has stored its reference to CORPUS[0] (not committed) when the purge runs.
        new = insert_events(ingest, "t1", [("new", _event("new", [CORPUS[0]]))], utcnow())
        thread, errors = _in_thread(lambda: _release(engine, pks["old"]))
        wait_for(blocked_on_a_lock(engine, "LOCK TABLE passage_texts"), timeout=30)
        ingest.commit()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert not errors
    assert new[0].pk is not None
    assert _texts_of(engine, {"old": pks["old"], "new": new[0].pk}) == {
        "old": [""],
        "new": [CORPUS[0]],
    }
    engine.dispose()


def test_an_ingest_waits_for_a_purge_and_stores_the_text_again(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    pks = _insert(engine, "t1", {"old": [CORPUS[0]]})
    inserted: dict[str, int] = {}
    with session_scope(engine) as purge:
        erase_passage_texts(purge, [pks["old"]])  # deleted, not committed
        thread, errors = _in_thread(
            lambda: inserted.update(_insert(engine, "t1", {"new": [CORPUS[0]]}))
        )
        # Ingest writes the texts in the statement that inserts the events (whose text
        # pg_stat_activity cuts at 1 kB, before the texts' part).
        wait_for(blocked_on_a_lock(engine, "WITH given AS (SELECT * FROM unnest("), timeout=30)
        purge.commit()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert not errors
    assert _texts_of(engine, {"old": pks["old"], "new": inserted["new"]}) == {
        "old": [""],
        "new": [CORPUS[0]],
    }
    assert _stored_texts(engine) == 1
    engine.dispose()


def _release(engine: Engine, event_pk: int) -> None:
    with session_scope(engine) as session:
        erase_passage_texts(session, [event_pk])
        session.commit()


def test_many_events_sharing_texts_read_back_in_rank_order(store_url: str) -> None:
    engine = make_engine(store_url)
    batch = {f"e{i}": [CORPUS[(i + j) % len(CORPUS)] for j in range(4)] for i in range(40)}
    pks = _insert(engine, "t1", batch)
    assert _texts_of(engine, pks) == batch
    assert _stored_texts(engine) == len(CORPUS)
    engine.dispose()


# An abstract's worth of prose compresses; so does non-ASCII prose (with an astral character).
# A short text does not: zlib's header and checksum alone are longer than it.
COMPRESSIBLE = [
    " ".join(
        f"sentence {i} of an abstract about protein folding and its assays." for i in range(20)
    ),
    " ".join(f"Résumé {i}: la protéine se replie ✓, 蛋白质折叠 🧬." for i in range(20)),
]
INCOMPRESSIBLE = ["ü✓ 🧬", "tiny"]


def _bodies(engine: Engine) -> dict[str, bytes]:
    with session_scope(engine) as session:
        rows = session.execute(text("SELECT content_hash, body FROM passage_texts")).all()
    return {digest: bytes(body) for digest, body in rows}


def test_a_text_is_stored_compressed_when_that_is_shorter_and_reads_back_identical(
    store_url: str,
) -> None:
    engine = make_engine(store_url)
    texts = COMPRESSIBLE + INCOMPRESSIBLE
    pks = _insert(engine, "t1", {"a": texts, "b": texts[::-1]}, with_ids=False)
    bodies = _bodies(engine)
    assert len(bodies) == len(texts)  # each text stored once, however many events send it
    for body in COMPRESSIBLE:
        stored = bodies[text_hash(body)]
        assert stored[:1] == ZLIB
        assert len(stored) < len(body.encode("utf-8")) * 0.6
        assert zlib.decompress(stored[1:]) == body.encode("utf-8")
    for body in INCOMPRESSIBLE:
        assert bodies[text_hash(body)] == PLAIN + body.encode("utf-8")
    read = _texts_of(engine, pks)
    assert read == {"a": texts, "b": texts[::-1]}
    assert [t.encode("utf-8") for t in read["a"]] == [t.encode("utf-8") for t in texts]
    # The judge reads the same texts.
    with session_scope(engine) as session:
        (loaded,) = load_many_for_judging(session, [pks["a"]])
    assert [p.text for p in loaded.passages] == texts[: len(loaded.passages)]
    engine.dispose()


def test_the_hashes_a_caller_made_for_some_passages_store_what_the_store_makes_itself(
    store_url: str,
) -> None:
    # Triage hashes only the passages the near-duplicate count compares; the store hashes the
    # rest. Each of none, some and all given must store the same references, hashes and texts.
    engine = make_engine(store_url)
    texts = [CORPUS[3], CORPUS[1], CORPUS[3], CORPUS[5]]
    stored = []
    for given in range(len(texts) + 1):
        event_id = f"prefix-{given}"
        with session_scope(engine) as session:
            (result,) = insert_events(
                session,
                "t1",
                [(event_id, _event(event_id, texts, with_ids=False))],
                utcnow(),
                content_hashes={event_id: [text_hash(t) for t in texts[:given]]},
            )
            session.commit()
        assert result.pk is not None
        with session_scope(engine) as session:
            (loaded,) = load_many_for_judging(session, [result.pk])
        stored.append([(p.rank, p.text, p.content_hash) for p in loaded.passages])
    assert stored[0] == [(rank, t, text_hash(t)) for rank, t in enumerate(texts, start=1)]
    assert all(rows == stored[0] for rows in stored)
    engine.dispose()
