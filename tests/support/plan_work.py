"""The work a read does in PostgreSQL, counted from its plans rather than timed.

``StatementLog`` records every SELECT an engine sends while it is attached; ``rows_read`` runs each
again under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` and adds up the rows its scans touched
(the rows they returned and the rows their filters removed, times their loops). That figure
follows the data a plan walks and not the machine's speed, so two volumes of the same database
can be compared on a shared, noisy machine.

``forget_statistics`` leaves the planner what a bulk load or a fresh day partition leaves it:
no statistics at all on the project's tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Engine

# Plan nodes that read a table or an index: their rows are the work a plan does.
_SCANS = {
    "Seq Scan",
    "Index Scan",
    "Index Only Scan",
    "Bitmap Heap Scan",
    "Tid Scan",
    "Tid Range Scan",
}
_REMOVED = ("Rows Removed by Filter", "Rows Removed by Index Recheck")


@dataclass
class StatementLog:
    """The SELECT statements (and their parameters) an engine sent while recording."""

    statements: list[tuple[str, Any]] = field(default_factory=list)
    recording: bool = False

    def record(
        self,
        _conn: object,
        _cursor: object,
        statement: str,
        parameters: Any,
        _context: object,
        _executemany: bool,
    ) -> None:
        if self.recording and statement.lstrip().upper().startswith(("SELECT", "WITH")):
            self.statements.append((statement, parameters))


@contextmanager
def statement_log(engine: Engine) -> Iterator[StatementLog]:
    log = StatementLog()
    event.listen(engine, "before_cursor_execute", log.record)
    try:
        yield log
    finally:
        event.remove(engine, "before_cursor_execute", log.record)


@contextmanager
def recording(log: StatementLog) -> Iterator[list[tuple[str, Any]]]:
    """What the log records inside the block (and only that)."""
    log.statements = []
    log.recording = True
    try:
        yield log.statements
    finally:
        log.recording = False


def _rows_of(node: Mapping[str, Any]) -> int:
    loops = int(node.get("Actual Loops", 1) or 1)
    rows = 0
    if node.get("Node Type") in _SCANS:
        touched = float(node.get("Actual Rows", 0)) + sum(float(node.get(k, 0)) for k in _REMOVED)
        rows += round(touched * loops)
    for child in node.get("Plans", ()):
        rows += _rows_of(child)
    return rows


def rows_read(engine: Engine, statements: Sequence[tuple[str, Any]]) -> int:
    """The rows the scans of ``statements`` touch, each statement planned and run again."""
    total = 0
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, parameters in statements:
            if statement.lstrip().upper().startswith("WITH") and " INSERT " in statement.upper():
                continue  # a write: never run twice
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", parameters)
            found = cursor.fetchone()
            assert found is not None
            plan = found[0] if not isinstance(found[0], str) else json.loads(found[0])
            total += _rows_of(plan[0]["Plan"])
        raw.rollback()
    finally:
        raw.close()
    return total


def forget_statistics(engine: Engine) -> None:
    """No planner statistics on the project's tables (partitions included), as a bulk load or a
    new partition leaves them; the server's autovacuum is told to gather none meanwhile."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(
            text(
                "DELETE FROM pg_statistic WHERE starelid IN (SELECT c.oid FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public')"
            )
        )
