"""Where the tests find the repository and the shared data sets (``../shared/data`` beside the
repository, or ``RM_SHARED_DATA``); a user's clone may have neither data folder."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    configured = os.environ.get("RM_SHARED_DATA")
    return Path(configured) if configured else REPO_ROOT.parent / "shared" / "data"
