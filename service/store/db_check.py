"""Warn about a PostgreSQL whose planner statistics will go stale.

The hottest lookups (known event ids at ingest, cached labels) probe their unique keys whatever
the statistics say (``service.store.lookups.lookup_each``); every other query leans on the
planner knowing how the tables are filled. Without ANALYZE it guesses a few hundred rows where there
are hundreds of thousands and picks scans that grow with the table: before the lookups were
rewritten, the load test stored 1,709 events/s over 100,000 with statistics and 314 without.
Autovacuum (on by default) keeps the statistics fresh; this check names the setting when it is off.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine, text

log = logging.getLogger(__name__)


def statistics_problem(autovacuum: str, track_counts: str) -> str | None:
    """A message when these server settings leave the planner's statistics to go stale."""
    off = [
        name
        for name, value in (("autovacuum", autovacuum), ("track_counts", track_counts))
        if value.strip().lower() != "on"
    ]
    if not off:
        return None
    return (
        f"PostgreSQL runs with {' and '.join(f'{name} off' for name in off)}: the planner's "
        "statistics of the events, passages and label tables go stale, and ingest and judging "
        "slow down as the tables grow. Turn autovacuum on (the default), or run ANALYZE on "
        "these tables regularly."
    )


def warn_if_statistics_go_stale(engine: Engine) -> str | None:
    """Log (and return) the problem of a PostgreSQL database; SQLite has nothing to check."""
    if engine.dialect.name != "postgresql":
        return None
    try:
        with engine.connect() as conn:
            autovacuum = str(conn.execute(text("SHOW autovacuum")).scalar_one())
            track_counts = str(conn.execute(text("SHOW track_counts")).scalar_one())
    except Exception:  # a database down at start is the readiness check's business
        log.debug("PostgreSQL settings not read", exc_info=True)
        return None
    problem = statistics_problem(autovacuum, track_counts)
    if problem is not None:
        log.warning(problem)
    return problem
