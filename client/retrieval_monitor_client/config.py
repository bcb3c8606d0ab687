"""The client's settings, checked where the application can see the mistake: in the constructor.

A bad URL, an API key that cannot go in an HTTP header, or a number that makes no sense would
otherwise surface on the sender thread, request after request, as events that never arrive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class SenderConfig:
    base_url: str
    api_key: str | None
    batch_size: int
    max_batch_bytes: int
    flush_interval: float
    timeout: float
    max_retry_wait: float
    max_backoff: float
    server_error_attempts: int
    compress_level: int
    max_answer_bytes: int


def checked_url(url: object) -> str:
    """``url`` without its trailing slash, if it is an absolute http(s) URL with a host."""
    if not isinstance(url, str):
        raise ValueError(f"url must be a str, not {type(url).__name__}")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise ValueError(f"url {url!r} is not a URL: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"url {url!r} must be http:// or https:// with a host")
    if parsed.query or parsed.fragment:
        raise ValueError(f"url {url!r} must not carry a query or a fragment")
    return url.rstrip("/")


def checked_api_key(api_key: object) -> str | None:
    """The key as it goes into ``Authorization: Bearer``: printable ASCII, nothing else."""
    if api_key is None:
        return None
    if not isinstance(api_key, str):
        raise ValueError(f"api_key must be a str, not {type(api_key).__name__}")
    if not (api_key.isascii() and api_key.isprintable()) or api_key != api_key.strip():
        raise ValueError("api_key must be printable ASCII without surrounding spaces")
    return api_key or None


def checked_label(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty str")
    return value


def checked_count(name: str, value: object, *, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int of at least {least}, not {value!r}")
    return value


def checked_seconds(name: str, value: object, *, zero_allowed: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number of seconds, not {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_allowed):
        bound = "at least 0" if zero_allowed else "more than 0"
        raise ValueError(f"{name} must be finite and {bound}, not {value!r}")
    return seconds
