"""API keys: made here, stored only as SHA-256, looked up on every request.

A key is 32 random bytes (``rm_`` + URL-safe base64); its SHA-256 identifies it in the database.
Comparing digests of a secret this long needs no slow hash: guessing is hopeless, and the lookup
compares the stored digest in constant time after finding the row.

Lookups are cached for ``CACHE_SECONDS``. Revoking a key bumps a revocation epoch in Redis; each
process reads the epoch at most every ``EPOCH_CHECK_SECONDS`` and empties its cache when it moved,
so a revocation reaches every replica within about a second rather than the cache's lifetime.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import sys
import time
from dataclasses import dataclass

from redis import Redis, RedisError
from sqlalchemy import Engine

from service.primitives.bounded_cache import BoundedCache
from service.store import keys as keys_repository
from service.store.engine import session_scope
from service.store.models import DEFAULT_TENANT

log = logging.getLogger(__name__)

# Without Redis (the epoch unreadable), a revoked key stops working within this many seconds.
CACHE_SECONDS = 30.0
EPOCH_CHECK_SECONDS = 1.0
REVOCATION_EPOCH_KEY = "rm:keys:revocation_epoch"
# What one process keeps of recent lookups: some 10,000 of them, found or not.
LOOKUP_CACHE_BYTES = 4 * 1024 * 1024


def new_key() -> str:
    return "rm_" + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def announce_revocation(redis: Redis) -> None:
    """Tell every process that a key was revoked (they drop their cached lookups)."""
    redis.incr(REVOCATION_EPOCH_KEY)


@dataclass(frozen=True)
class Principal:
    tenant: str
    is_admin: bool = False
    # The key that called (None without keys): who labelled, on gold marked by people.
    key_id: int | None = None
    key_name: str = ""

    @property
    def labeller(self) -> str | None:
        return None if self.key_id is None else f"key:{self.key_id}"


ANONYMOUS = Principal(DEFAULT_TENANT, is_admin=False)


def _lookup_bytes(lookup: tuple[float, Principal | None]) -> int:
    """A cached lookup's weight: the pair, the time, and the principal with its two texts (an
    admin chose them; their columns bound their length)."""
    _, principal = lookup
    weight = sys.getsizeof(lookup) + sys.getsizeof(0.0)
    if principal is not None:
        weight += (
            sys.getsizeof(principal)
            + sys.getsizeof(principal.tenant)
            + sys.getsizeof(principal.key_name)
        )
    return weight


class KeyStore:
    """Resolves a presented key to its tenant, with a short cache so a request costs no query."""

    def __init__(self, engine: Engine, redis: Redis | None = None) -> None:
        self.engine = engine
        self.redis = redis
        # Keyed by the presented key's digest; unknown keys cannot grow it past its budget.
        self._cache: BoundedCache[tuple[float, Principal | None]] = BoundedCache(
            LOOKUP_CACHE_BYTES, size_of=_lookup_bytes
        )
        self._epoch: object = None
        self._epoch_read_at = float("-inf")

    def principal(self, presented: str) -> Principal | None:
        return self.principal_of_digest(key_hash(presented))

    def principal_of_digest(self, digest: str) -> Principal | None:
        now = time.monotonic()
        self._follow_revocations(now)
        cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        with session_scope(self.engine) as session:
            record = keys_repository.active_key(session, digest)
        found = (
            Principal(record.tenant, record.is_admin, record.key_id, record.name)
            if record is not None and hmac.compare_digest(record.key_hash, digest)
            else None
        )
        self._cache.put(digest, (now, found))
        return found

    def _follow_revocations(self, now: float) -> None:
        if self.redis is None or now - self._epoch_read_at < EPOCH_CHECK_SECONDS:
            return
        self._epoch_read_at = now
        try:
            epoch = self.redis.get(REVOCATION_EPOCH_KEY)
        except RedisError:
            # Redis away: the cache's own lifetime still bounds how long a revoked key works.
            log.warning("revocation epoch unreadable", exc_info=True)
            return
        if epoch != self._epoch:
            self._epoch = epoch
            self._cache.clear()
