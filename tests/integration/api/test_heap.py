"""The API exempts what start-up built from the cyclic collector, which still collects the rest."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.support.environment import make_settings


class _Node:
    def __init__(self) -> None:
        self.partner: _Node | None = None


def test_the_api_freezes_what_start_up_built(tmp_path: Path, redis_url: str) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'rm.db'}", redis_url)
    try:
        with TestClient(create_app(settings)) as client:
            # The modules, models and app objects: far more than a handful.
            assert gc.get_freeze_count() > 10_000
            # A reference cycle made after start-up is still collected.
            first, second = _Node(), _Node()
            first.partner, second.partner = second, first
            gone = weakref.ref(first)
            del first, second
            gc.collect()
            assert gone() is None
            assert client.get("/healthz").status_code == 200
    finally:
        gc.unfreeze()
