"""Looking up many keys in one statement: one unique-key probe per wanted key on PostgreSQL,
whatever its planner statistics."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, String, bindparam, func, select, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.selectable import TableValuedAlias


def unnest_keys(**columns: list[str]) -> TableValuedAlias:
    """PostgreSQL rows ``wanted(<column>, ...)`` from one array parameter per column.

    Arrays, not a VALUES list: the statement's text stays the same whatever the number of keys,
    so SQLAlchemy compiles it once (a VALUES list of 220 ids was compiled anew on every ingest
    batch: 15 ms of CPU) and PostgreSQL can keep it prepared.
    """
    arrays = [
        bindparam(f"wanted_{name}", value, type_=ARRAY(String)) for name, value in columns.items()
    ]
    return func.unnest(*arrays).table_valued(*columns).render_derived(name="wanted")


def lookup_each(wanted: TableValuedAlias, row: Select[Any]) -> Select[Any]:
    """``wanted``'s columns beside the one row ``row`` finds for each (missing rows dropped).

    A correlated LATERAL subquery with LIMIT 1 keeps PostgreSQL from flattening the lookup into
    a join: each wanted row becomes one probe of the unique key. Without statistics the planner
    otherwise scans every row of the judge or the tenant for each statement, a cost that grows
    with the table (measured: 455 ms against 1.5 ms for 112 pairs among 100,000 labels).
    """
    found = row.limit(1).lateral("found")
    return select(*wanted.c, *found.c).select_from(wanted).join(found, true())
