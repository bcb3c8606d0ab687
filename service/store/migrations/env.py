"""Alembic environment: the URL comes from the caller (service.store.migrate) or the settings."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from service.config.settings import get_settings
from service.store import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from service.store.engine import make_engine
from service.store.partitions import PARTITIONED, POSTGRES_ONLY

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
target_metadata = SQLModel.metadata


_PARTITIONED = {table for table, _column in PARTITIONED}
# What PostgreSQL's day layout (service/store/partitions.py) holds that the models do not say,
# or says otherwise, on purpose: each table's partitions and the duplicate check's own table,
# which stands in for the unique constraint a partitioned table cannot have; and the partitioned
# tables' foreign keys to events, which a day's drop would have to check row by row.
_LAYOUT_ONLY_TABLES = set(POSTGRES_ONLY.tables)


def include_object(
    item: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Whether ``alembic check`` compares this object: not what the day layout adds or leaves
    out on purpose (it is built by migration 0012, and checked by its own tests)."""
    if url.startswith("sqlite"):
        return True
    if type_ == "table" and reflected and compare_to is None:
        base = (name or "").rsplit("_", 1)[0]
        return not (name in _LAYOUT_ONLY_TABLES or base in _PARTITIONED)
    if type_ == "unique_constraint" and name == "uq_events_tenant_event_id":
        return False
    if type_ == "foreign_key_constraint":
        if getattr(getattr(item, "table", None), "name", None) in _PARTITIONED:
            return False
        # A key to the partitioned events reads back as one per partition besides its own.
        referred = {element.column.table.name for element in getattr(item, "elements", ())}
        return not (reflected and referred - _PARTITIONED)
    return True


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            include_object=include_object,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
