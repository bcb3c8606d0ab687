"""Storage: database bytes per event when passages recur as they do over a corpus.

The workload: SciFact's 300 test claims (``../shared/data/scifact``; without it, the demo's
synthetic corpus), each with its BM25 top 20 (k=10, the window up to 2k), replayed three times
with reworded queries (as asked, then "is it true that ...", then without the last word), so the
same abstracts come back across queries and rounds as a corpus's chunks do.

Each store (SQLite, PostgreSQL) is filled twice with the same events: once in the layout of
migration 0005, where every passage row carries its own text (the baseline), and once through
``insert_events`` at the current schema, in commit groups of 50. Bytes: on PostgreSQL the sum of
``pg_total_relation_size`` of the ingest tables (events, passages, passage_texts: heap, TOAST and
indexes); on SQLite the database file after a WAL checkpoint. A third figure is the 0005 database
after ``migrate`` to the current schema. Run: ``python -m tests.benchmarks.bench_storage``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import MetaData, create_engine, text

from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.primitives.hashing import text_hash
from service.replay.beir import BeirDataset, load_beir
from service.replay.bm25 import Bm25Index
from service.replay.replay import ReplayConfig, build_event
from service.replay.workload import generate_workload
from service.store.engine import make_engine, session_scope
from service.store.events import _event_row, insert_events, passage_key, payload_hash
from service.store.migrate import upgrade
from tests.benchmarks.common import Figure, postgres_database, run_benchmark
from tests.support.paths import shared_data_dir

# The tables ingest writes; on PostgreSQL also the duplicate check's own (the events being
# partitioned by day, service/store/partitions.py).
INGEST_TABLES = ("events", "passages", "passage_texts", "event_keys")
GROUP = 50  # events per commit, as a group commit gathers them


@dataclass(frozen=True)
class Workload:
    name: str
    events: list[EventIn]
    passages: int
    distinct_texts: int


def reworded(query: str, round_number: int) -> str:
    words = query.rstrip(".?").split()
    if round_number == 1:
        return f"Is it true that {query[:1].lower()}{query[1:]}"
    if round_number == 2 and len(words) > 3:
        return " ".join(words[:-1])
    return query


def build_workload(claims: int, rounds: int, window: int) -> Workload:
    scifact = shared_data_dir() / "scifact"
    with tempfile.TemporaryDirectory(prefix="rm-bench-storage-") as folder:
        if scifact.is_dir():
            dataset, name = load_beir(scifact, "test"), "SciFact"
        else:
            dataset = load_beir(generate_workload(Path(folder), claims, seed=7), "test")
            name = "synthetic corpus (SciFact absent)"
    return _events(dataset, name, claims, rounds, window)


def _events(dataset: BeirDataset, name: str, claims: int, rounds: int, window: int) -> Workload:
    index = Bm25Index.build({doc_id: doc.full_text for doc_id, doc in dataset.corpus.items()})
    cfg = ReplayConfig(base_url="http://unused", k=window // 2, window=window)
    events: list[EventIn] = []
    for round_number in range(rounds):
        for query_id in list(dataset.queries)[:claims]:
            query = reworded(dataset.queries[query_id], round_number)
            hits = index.search(query, window)
            if not hits:
                continue
            body = build_event(query_id, query, hits, dataset, cfg)
            body["event_id"] = f"r{round_number}-{query_id}"
            events.append(EventIn.model_validate(body))
    texts = {p.text for event in events for p in event.passages}
    passages = sum(len(event.passages) for event in events)
    return Workload(name, events, passages, len(texts))


def fill_old_layout(url: str, events: list[EventIn]) -> None:
    """The events as the 0005 schema stored them: every passage row with its own text."""
    upgrade(url, "0005")
    engine = create_engine(url)
    tables = MetaData()
    tables.reflect(engine, only=["events", "passages"])
    events_table, passages_table = tables.tables["events"], tables.tables["passages"]
    now = utcnow()
    for start in range(0, len(events), GROUP):
        with engine.begin() as conn:
            for event in events[start : start + GROUP]:
                assert event.event_id is not None
                row = _event_row("default", event.event_id, event, now)
                row["metadata"] = row.pop("event_metadata")
                row["payload_hash"] = payload_hash(event)
                row["priority"] = 0
                pk = conn.execute(
                    events_table.insert().returning(events_table.c.id), row
                ).scalar_one()
                conn.execute(
                    passages_table.insert(),
                    [
                        {
                            "event_pk": pk,
                            "rank": rank,
                            "passage_id": passage_key(p.id, text_hash(p.text)),
                            "text": p.text,
                            "score": p.score,
                            "content_hash": text_hash(p.text),
                        }
                        for rank, p in enumerate(event.passages, start=1)
                    ],
                )
    engine.dispose()


def fill_passage_store(url: str, events: list[EventIn]) -> None:
    """The events through the store's own ingest write, in commit groups."""
    upgrade(url)
    engine = make_engine(url)
    for start in range(0, len(events), GROUP):
        group = [(e.event_id or "", e) for e in events[start : start + GROUP]]
        with session_scope(engine) as session:
            insert_events(session, "default", group, utcnow())
            session.commit()
    engine.dispose()


def database_bytes(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                present = [
                    name
                    for (name,) in conn.execute(
                        text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                    )
                    if name in INGEST_TABLES
                ]
                # A partitioned table keeps nothing itself: its partitions' sizes are summed.
                return sum(
                    int(
                        conn.execute(
                            text(
                                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                                "WHERE c.oid = CAST(:t AS regclass) OR c.oid IN "
                                "(SELECT relid FROM pg_partition_tree(CAST(:t AS regclass)))"
                            ),
                            {"t": name},
                        ).scalar_one()
                    )
                    for name in present
                )
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    finally:
        engine.dispose()
    return Path(url.removeprefix("sqlite:///")).stat().st_size


@contextmanager
def store(kind: str, name: str) -> Iterator[str]:
    if kind == "postgres":
        with postgres_database(f"rm_bench_storage_{name}") as url:
            yield url
        return
    with tempfile.TemporaryDirectory(prefix="rm-bench-storage-") as folder:
        yield f"sqlite:///{Path(folder) / 'rm.db'}"


def measure(args: argparse.Namespace) -> list[Figure]:
    workload = build_workload(args.claims, args.rounds, args.window)
    events = workload.events
    note = (
        f"{workload.name}: {len(events)} events, {workload.passages} passages, "
        f"{workload.distinct_texts} distinct texts"
    )
    print(note, file=sys.stderr)
    figures = []
    for kind in ("sqlite", *(() if args.no_postgres else ("postgres",))):
        with store(kind, "old") as old_url:
            fill_old_layout(old_url, events)
            before = database_bytes(old_url) / len(events)
            started = time.monotonic()
            upgrade(old_url)
            migrate_seconds = time.monotonic() - started
            migrated = database_bytes(old_url) / len(events)
        with store(kind, "new") as new_url:
            fill_passage_store(new_url, events)
            after = database_bytes(new_url) / len(events)
        what = "the SQLite file" if kind == "sqlite" else "the tables ingest writes"
        baseline = "every passage with its own text (schema 0005)"
        figures += [
            Figure(
                10,
                f"database bytes per event ({kind}, {what}), passage store",
                after,
                "B",
                baseline,
                before,
                target="<= 0.20x baseline",
                note=note,
            ),
            Figure(
                10,
                f"database bytes per event ({kind}), the 0005 database after migrate",
                migrated,
                "B",
                baseline,
                before,
                target="<= 0.20x baseline",
                note=f"migration took {migrate_seconds:.1f} s",
            ),
        ]
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claims", type=int, default=300, help="queries per round")
    parser.add_argument("--rounds", type=int, default=3, help="replays, each reworded")
    parser.add_argument("--window", type=int, default=20, help="passages per event (2k)")
    parser.add_argument("--no-postgres", action="store_true")


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
