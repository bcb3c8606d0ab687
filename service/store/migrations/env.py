"""Alembic environment: the URL comes from the caller (service.store.migrate) or the settings."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from service.kernel.settings import get_settings
from service.store import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from service.store.engine import make_engine

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
target_metadata = SQLModel.metadata


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
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
