"""Tables that already hold many judged events, as a service's database does after a while.

``fill`` stores ``count`` events (k=10, passages from the ingest benchmark's pool) through the
store's own ingest write, in commit groups, then gives each a score, a judge run and a judgment per
passage with a few set-based statements, and marks them judged: nothing is left for a worker to
do, but every table a judged event touches has its rows. No ``ANALYZE`` follows (a ``VACUUM``
does, which gathers none): the planner's statistics are what a bulk load leaves (none on a
server whose autovacuum is off, as here).
``export`` then rebuilds the shared aggregates from them, so a service started next does not.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sqlalchemy import text

from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.store.engine import make_engine, session_scope
from service.store.events import insert_events
from service.store.migrate import upgrade
from tests.benchmarks.bench_ingest import event
from tests.benchmarks.common import in_process_settings

GROUP = 1000
JUDGE = "earlier-judge"
PROMPT_VERSION = "earlier"

# Set-based: every earlier event judged at once, in the server, whatever the count.
_JUDGED = (
    """
INSERT INTO scores (event_pk, judge, prompt_version, alpha, np_window, precision, ndcg,
                    created_at)
SELECT id, :judge, :version, 0.5, 0, 0.5, 0.5, received_at FROM events
WHERE event_id LIKE 'earlier-%'
""",
    """
INSERT INTO judge_runs (event_pk, judge, model, prompt_version, context_rating, calls,
                        prompt_tokens, completion_tokens, cache_hits, missing_labels,
                        malformed_replies, created_at)
SELECT id, :judge, :judge, :version, 2, 1, 0, 0, 0, 0, 0, received_at FROM events
WHERE event_id LIKE 'earlier-%'
""",
    """
INSERT INTO judgments (event_pk, rank, judge, model, prompt_version, grade, relevant, from_cache,
                       created_at)
SELECT p.event_pk, p.rank, :judge, :judge, :version, p.rank % 4, p.rank % 4 >= 2, false,
       e.received_at
FROM passages p JOIN events e ON e.id = p.event_pk
WHERE e.event_id LIKE 'earlier-%'
""",
    """
UPDATE events SET status = 'judged', judged_at = received_at WHERE event_id LIKE 'earlier-%'
""",
)


def fill(database_url: str, count: int) -> float:
    """Store ``count`` judged events; the seconds it took."""
    started = time.monotonic()
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        for first in range(0, count, GROUP):
            batch = [
                (f"earlier-{n}", EventIn.model_validate(event(n, "earlier")))
                for n in range(first, min(first + GROUP, count))
            ]
            with session_scope(engine) as session:
                insert_events(session, "default", batch, utcnow())
                session.commit()
            if first and first % (20 * GROUP) == 0:
                print(f"[earlier] {first:,} of {count:,} events", file=sys.stderr, flush=True)
        with engine.begin() as conn:
            for statement in _JUDGED:
                conn.execute(text(statement), {"judge": JUDGE, "version": PROMPT_VERSION})
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                # The events went in pending and were then marked judged: VACUUM (which gathers
                # no planner statistics) removes the dead row versions that left, as a load of
                # rows already judged would have none. The load's dirty pages are written out
                # now, not by a checkpoint during the measured run.
                conn.execute(text("VACUUM"))
                conn.execute(text("CHECKPOINT"))
    finally:
        engine.dispose()
    return time.monotonic() - started


def export(database_url: str, tmp: Path) -> float:
    """Rebuild the shared aggregates from the filled tables, as a service does once after Redis
    lost them; the seconds it took. A service started afterwards finds them complete."""
    from service.telemetry.rebuild import ensure_aggregates
    from service.wiring.runtime import Runtime

    started = time.monotonic()
    runtime = Runtime(in_process_settings(database_url, tmp))
    try:
        ensure_aggregates(runtime)
    finally:
        runtime.engine.dispose()
    return time.monotonic() - started
