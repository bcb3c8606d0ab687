"""Outside tools a test needs, skipped with a reason where absent."""

from __future__ import annotations

import shutil

import pytest


def require_tool(name: str) -> str:
    """The tool's path; skip without it, or fail in CI where the test command installs it."""
    path = shutil.which(name)
    if path:
        return path
    pytest.skip(f"{name} is not installed (scripts/install-test-tools.sh installs it)")
