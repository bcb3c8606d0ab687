"""The startup warning about a PostgreSQL that leaves the planner's statistics to go stale."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import create_engine, text

from service.store.db_check import statistics_problem, warn_if_statistics_go_stale


def test_the_default_settings_are_fine_and_each_setting_off_is_named() -> None:
    assert statistics_problem("on", "on") is None
    autovacuum_off = statistics_problem("off", "on")
    assert autovacuum_off is not None
    assert "autovacuum off" in autovacuum_off
    assert "track_counts" not in autovacuum_off
    both_off = statistics_problem("off", "off")
    assert both_off is not None
    assert "autovacuum off and track_counts off" in both_off


@pytest.mark.postgres
def test_a_real_server_is_judged_by_what_it_reports(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            reported = {
                name: str(conn.execute(text(f"SHOW {name}")).scalar_one())
                for name in ("autovacuum", "track_counts")
            }
        with caplog.at_level(logging.WARNING, logger="service.store.db_check"):
            problem = warn_if_statistics_go_stale(engine)
    finally:
        engine.dispose()
    if reported == {"autovacuum": "on", "track_counts": "on"}:
        assert problem is None
        assert not caplog.records
    else:
        assert problem is not None
        assert problem in caplog.text


def test_sqlite_has_nothing_to_check(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:
        assert warn_if_statistics_go_stale(engine) is None
    finally:
        engine.dispose()
