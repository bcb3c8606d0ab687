"""The ``serve`` command line: how many API processes, and combinations it refuses.

Tests ``service.cli.main``.
"""

from __future__ import annotations

import pytest

from service.cli.main import build_parser
from service.cli.serve import cmd_serve
from service.config.settings import Settings


def test_serve_takes_a_number_of_api_processes() -> None:
    assert build_parser().parse_args(["serve", "--workers", "3"]).workers == 3
    assert build_parser().parse_args(["serve"]).workers is None  # RM_API_WORKERS decides


def test_serve_refuses_fewer_than_one_api_process(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--workers", "0"])
    assert "must be at least 1" in capsys.readouterr().err


def test_the_demo_runs_in_one_api_process(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["serve", "--demo", "--workers", "2"])
    # Refused before anything starts: no Redis, no database, no worker.
    assert cmd_serve(args, Settings(database_url="sqlite:///unused.db")) == 2
    assert "--demo runs one API process" in capsys.readouterr().err


def test_the_setting_is_the_default_number_of_processes(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["serve", "--demo"])
    assert cmd_serve(args, Settings(api_workers=2)) == 2
    assert "--demo runs one API process" in capsys.readouterr().err
