"""Login sessions of the pages: a random token in the browser's cookie, never the API key.

The token names a record in Redis (the tenant's key hash, with the cookie's lifetime as TTL);
logging out deletes the record, so a copied cookie stops working at once. The key behind a session
is checked on every use, so revoking the key also ends its sessions.
"""

from __future__ import annotations

import hashlib
import secrets

from redis import Redis

from service.primitives.keys import redis_key

COOKIE_NAME = "rm_ui_session"
SESSION_NAMESPACE = "rm:ui:session"
SESSION_SECONDS = 12 * 3600


def record_key(token: str) -> str:
    # Only a digest of the token is stored: reading Redis does not give a usable cookie.
    return redis_key(SESSION_NAMESPACE, hashlib.sha256(token.encode()).hexdigest())


class SessionStore:
    def __init__(self, redis: Redis, lifetime_seconds: int = SESSION_SECONDS) -> None:
        self.redis = redis
        self.lifetime_seconds = lifetime_seconds

    def open(self, key_digest: str) -> str:
        token = secrets.token_urlsafe(32)
        self.redis.set(record_key(token), key_digest, ex=self.lifetime_seconds)
        return token

    def key_digest(self, token: str) -> str | None:
        """The hash of the API key the session was opened with, or None when it ended."""
        value = self.redis.get(record_key(token))
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def close(self, token: str) -> None:
        self.redis.delete(record_key(token))
