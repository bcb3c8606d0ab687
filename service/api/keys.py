"""API keys: made here, stored only as SHA-256, looked up on every request.

A key is 32 random bytes (``rm_`` + URL-safe base64); its SHA-256 identifies it in the database.
Comparing digests of a secret this long needs no slow hash: guessing is hopeless, and the lookup
compares the stored digest in constant time after finding the row.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Engine

from service.store import keys as keys_repository
from service.store.engine import session_scope

DEFAULT_TENANT = "default"
# A revoked key stops working within this many seconds (the lookup cache's lifetime).
CACHE_SECONDS = 30.0


def new_key() -> str:
    return "rm_" + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    tenant: str
    is_admin: bool = False


ANONYMOUS = Principal(DEFAULT_TENANT, is_admin=False)


class KeyStore:
    """Resolves a presented key to its tenant, with a short cache so a request costs no query."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._cache: dict[str, tuple[float, Principal | None]] = {}

    def principal(self, presented: str) -> Principal | None:
        digest = key_hash(presented)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        with session_scope(self.engine) as session:
            record = keys_repository.active_key(session, digest)
        found = (
            Principal(record.tenant, record.is_admin)
            if record is not None and hmac.compare_digest(record.key_hash, digest)
            else None
        )
        if len(self._cache) > 10_000:  # bounded: unknown keys cannot grow it without end
            self._cache.clear()
        self._cache[digest] = (now, found)
        return found
