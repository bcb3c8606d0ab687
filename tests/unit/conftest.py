"""Unit tests need nothing but this process: no Redis, no database server, no network, no
subprocess. The guard below makes a test that reaches for one fail here, so the folder keeps
running on a machine with nothing else running (``pytest tests/unit``)."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest


class OutsideThisProcessError(RuntimeError):
    """A unit test tried to reach past its own process."""


def _refuse(what: str) -> Any:
    def refuse(*args: object, **kwargs: object) -> Any:
        raise OutsideThisProcessError(
            f"unit tests may not {what}; move the test to tests/integration"
        )

    return refuse


@pytest.fixture(autouse=True)
def only_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _refuse("open a network connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("open a network connection"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a subprocess"))
