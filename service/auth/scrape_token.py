"""The scrape credential of /metrics: a bearer token provisioned with the deployment (a mounted
secret file), so the bundled Prometheus can read /metrics while keys are on without an admin API
key, which would also let it apply calibrations and read every tenant's pages.
"""

from __future__ import annotations

import hmac
from pathlib import Path

MIN_TOKEN_CHARS = 16


class ScrapeTokenError(ValueError):
    """The configured token file cannot serve as a credential."""


def read_scrape_token(path: str | None) -> str | None:
    """The token in ``path`` (surrounding whitespace dropped); None when no file is configured.

    A missing, unreadable, empty or short file stops the API at start rather than leaving
    /metrics with a guessable credential or none at all.
    """
    if path is None:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ScrapeTokenError(f"RM_METRICS_TOKEN_FILE {path!r} cannot be read: {exc}") from exc
    if len(token) < MIN_TOKEN_CHARS:
        raise ScrapeTokenError(
            f"RM_METRICS_TOKEN_FILE {path!r} holds {len(token)} characters; a scrape token needs "
            f"at least {MIN_TOKEN_CHARS} (e.g. the output of `openssl rand -hex 24`)"
        )
    return token


def is_scrape_token(presented: str | None, token: str | None) -> bool:
    """Whether the presented credential is the scrape token (compared in constant time)."""
    if presented is None or token is None:
        return False
    return hmac.compare_digest(presented.encode(), token.encode())
