"""In CI a skip that hides a missing prerequisite fails the run; on a user's machine it stays a
skip with its reason. Checked on a probe test file run by a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

PROBE = """
import pytest

def test_missing_tool():
    pytest.skip("redis-server is not installed")

def test_opt_in_output():
    pytest.skip("set RM_UI_SCREENSHOTS_DIR to write them")

@pytest.mark.skipif(True, reason="SciFact is not at ../shared/data")
def test_missing_data():
    pass
"""


def run_probe(tmp_path: Path, ci: str) -> str:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-rA",
            "-q",
            "-p",
            "no:cacheprovider",
            str(probe),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_skip_for_a_missing_part_fails(tmp_path: Path, ci: str) -> None:
    out = run_probe(tmp_path, ci)
    assert "FAILED" in out
    assert "test_missing_tool - skipped in CI" in out
    assert "test_missing_data - skipped in CI" in out
    assert "SKIPPED [1] test_probe.py:8: set RM_UI_SCREENSHOTS_DIR" in out


def test_outside_ci_the_same_skips_stay_skips_with_their_reason(tmp_path: Path) -> None:
    out = run_probe(tmp_path, "")
    assert "3 skipped" in out
    assert "redis-server is not installed" in out
    assert "SciFact is not at ../shared/data" in out
