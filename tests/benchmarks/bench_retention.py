"""Removing an old day: dropping its partitions (PostgreSQL) against the text purge's UPDATE.

For each size, two databases get the same load: ``--events`` judged events (k=10, passages from
the ingest benchmark's pool) stored three days ago, and a tenth as many stored today, which
share the pool's texts. Then, timed:
- **drop**: ``remove_events_before`` at the start of yesterday, as ``RM_KEEP_EVENTS_DAYS``
  does: the old day's duplicate keys deleted, then one DROP per partitioned table (its texts,
  which are the day's own copies, with them);
- **purge** (baseline): the text purge ``RM_RETENTION_DAYS`` runs today, in its batches of
  1,000: an UPDATE of every old event and of each of its passage references.
"Rows written" counts what each wrote row by row (rows deleted or updated); a dropped partition
counts none. Run: ``python -m tests.benchmarks.bench_retention [--events 10000 100000]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from service.contract.schemas import EventIn
from service.store.engine import make_engine, session_scope
from service.store.events import insert_events
from service.store.judging import purge_texts
from service.store.migrate import upgrade
from service.store.partitions import day_number, ensure_days_ahead
from service.store.retention import remove_events_before
from tests.benchmarks.bench_ingest import event
from tests.benchmarks.common import Figure, postgres_database, run_benchmark
from tests.benchmarks.earlier_events import _JUDGED, JUDGE, PROMPT_VERSION

GROUP = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, nargs="+", default=[10_000, 100_000])


def _fill(url: str, old: int, now: datetime) -> None:
    upgrade(url)
    engine = make_engine(url)
    old_day = now - timedelta(days=3)
    ensure_days_ahead(engine, day_number(old_day), 0)
    try:
        for count, moment, prefix in ((old, old_day, "earlier"), (old // 10, now, "today")):
            for first in range(0, count, GROUP):
                batch = [
                    (f"{prefix}-{n}", EventIn.model_validate(event(n, prefix)))
                    for n in range(first, min(first + GROUP, count))
                ]
                with session_scope(engine) as session:
                    insert_events(session, "default", batch, moment)
                    session.commit()
        with engine.begin() as conn:  # every old event judged: scores, runs, grades
            for statement in _JUDGED:
                conn.execute(text(statement), {"judge": JUDGE, "version": PROMPT_VERSION})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM"))
            conn.execute(text("CHECKPOINT"))
    finally:
        engine.dispose()


def _drop(url: str, cutoff: datetime) -> tuple[float, float, int, str]:
    engine = make_engine(url)
    try:
        started = time.perf_counter()
        removal = remove_events_before(engine, cutoff)
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    days = [day for day in removal.days if day.events]
    written = sum(day.events for day in days)  # a duplicate key deleted each
    drop = sum(day.seconds_drop for day in days)
    note = (
        f"{removal.events:,} events left; their duplicate keys deleted in "
        f"{sum(d.seconds_keys for d in days):.3f} s, the DROP statements {drop:.3f} s"
    )
    return seconds, drop, written, note


def _purge(url: str, cutoff: datetime) -> tuple[float, int]:
    engine = make_engine(url)
    written = 0
    try:
        started = time.perf_counter()
        while True:  # as the purge task runs it
            with session_scope(engine) as session:
                count = purge_texts(session, cutoff, limit=1000)
                session.commit()
            written += count * 11  # each event and its ten references
            if count < 1000:
                break
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    return seconds, written


def measure(args: argparse.Namespace) -> list[Figure]:
    now = datetime.now(UTC)
    cutoff = now - timedelta(days=1)
    figures: list[Figure] = []
    for size in args.events:
        print(f"[retention] {size:,} events, two databases", file=sys.stderr, flush=True)
        with postgres_database("rm_bench_drop") as drop_url:
            _fill(drop_url, size, now)
            drop_seconds, drop_only, drop_written, note = _drop(drop_url, cutoff)
        with postgres_database("rm_bench_purge") as purge_url:
            _fill(purge_url, size, now)
            purge_seconds, purge_written = _purge(purge_url, cutoff)
        figures += [
            Figure(
                14,
                f"removing a day of {size:,} events (postgres), seconds",
                drop_seconds,
                "s",
                "the text purge's UPDATE of the same day",
                purge_seconds,
                target="same order at 10,000 and 100,000",
                note=note,
            ),
            Figure(
                14,
                f"removing a day of {size:,} events (postgres), the DROP statements alone",
                drop_only,
                "s",
                "the text purge's UPDATE of the same day",
                purge_seconds,
                target="no per-row work",
            ),
            Figure(
                14,
                f"removing a day of {size:,} events (postgres), rows written one by one",
                float(drop_written),
                "rows",
                "the text purge's UPDATE of the same day",
                float(purge_written),
                target="reported",
                note="duplicate keys deleted; the purge: every event and reference updated",
            ),
        ]
    return figures


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
