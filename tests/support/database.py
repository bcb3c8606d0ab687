"""Reading the database behind a test's app."""

from __future__ import annotations

from sqlalchemy import create_engine, func, select

from service.kernel.settings import Settings


def count_rows(settings: Settings, model: type) -> int:
    engine = create_engine(settings.database_url)
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())
