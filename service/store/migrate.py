"""Bring a database's schema up to date with the Alembic migrations shipped in the package."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from service.primitives.clock import utcnow
from service.store.engine import make_engine
from service.store.partitions import DAYS_AHEAD, day_number, ensure_days_ahead

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would eat a '%' in a password.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrate, then (PostgreSQL, at the head) create the day partitions of today and the next
    days that are missing, so a service started after days off stores into them at once."""
    command.upgrade(alembic_config(database_url), revision)
    if revision == "head":
        engine = make_engine(database_url)
        try:
            ensure_days_ahead(engine, day_number(utcnow()), DAYS_AHEAD)
        finally:
            engine.dispose()
