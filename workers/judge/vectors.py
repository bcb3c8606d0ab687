"""The local judge's passage vectors, kept in Redis so that every worker process and replica
encodes a distinct passage once.

Why Redis and not the database: a vector is derived data, remade by encoding the passage again,
and Redis is where the project keeps what may be lost (the database holds what may not). One
Lua call reads every vector a slice needs, with no schema and no table that grows with every
passage ever seen; the bound below keeps the memory fixed. Losing the vectors (a flush, a restart
without persistence, an unreachable Redis) only costs encoding them again: a failed read counts
as a miss, a failed write is dropped.

Layout, per vector version (see ``vector_version``):

- ``rm:vectors:<version>``: a hash from ``vector_field(scope, content hash)`` to the vector's
  float32 bytes, exactly as the encoder returned them (the int8 encoder's output included: it is
  float32 too). The scope is the tenant whose event made it (``derived_scope``, one shared scope
  when the deployment shares derived data), so whether a text was seen before by another tenant
  cannot be told from how fast its vector comes; one bound covers every scope;
- ``rm:vectors:<version>:used``: a sorted set of the same fields by last use, so past
  ``max_entries`` the least recently used go, in the same script that adds.

About 1.7 KB per vector of 384 numbers (1,536 bytes, the hash field, the sorted-set entry), so
``max_entries`` x 1.7 KB bounds the memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from redis import Redis
from redis.exceptions import RedisError

from service.primitives.keys import composite_key, composite_parts, redis_key

log = logging.getLogger(__name__)

F32 = npt.NDArray[np.float32]

NAMESPACE = "rm:vectors"
# Lua's stack takes a few thousand arguments; a slice asks for far fewer, longer lists are split.
_CHUNK = 1000

# KEYS: hash, used set. ARGV: now, content hashes. Returns the vectors (false when absent) and
# marks the ones found as used now.
_READ = """
local found = redis.call('HMGET', KEYS[1], unpack(ARGV, 2))
for i, value in ipairs(found) do
  if value then redis.call('ZADD', KEYS[2], 'XX', ARGV[1], ARGV[i + 1]) end
end
return found
"""

# KEYS: hash, used set. ARGV: now, max entries, then content hash and vector pairs. Adds the
# vectors, then drops the least recently used past the bound; returns how many it dropped.
_WRITE = """
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], ARGV[1], ARGV[i])
end
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[2])
if over <= 0 then return 0 end
local oldest = redis.call('ZPOPMIN', KEYS[2], over)
for i = 1, #oldest, 2 do redis.call('HDEL', KEYS[1], oldest[i]) end
return over
"""


def vector_version(judge: str, encoder_version: str, backend: str, dim: int) -> str:
    """What a vector was made by: the judge, its prompt version's stem (``sim-v1``,
    ``sim-v1-int8``), the encoder backend and the width. Vectors of one version are never read
    under another: int8 vectors differ from float32 ones, and even the two float32 backends
    differ in the last bits, which would make a cached grade differ from a fresh one."""
    return composite_key(judge, encoder_version, backend, str(dim))


def vector_field(scope: str, content_hash: str) -> str:
    """The field a vector is kept under: whose derived data it is, and the text's hash."""
    return composite_key(scope, content_hash)


def vector_keys(version: str) -> tuple[str, str]:
    """The hash of a vector version's vectors and the sorted set of their last use."""
    parts = composite_parts(version)
    return redis_key(NAMESPACE, *parts), redis_key(NAMESPACE, *parts, "used")


class RedisVectors:
    """Vectors by field (``vector_field``) for one vector version, bounded to ``max_entries``."""

    def __init__(self, redis: Redis, version: str, dim: int, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.version = version
        self.dim = dim
        self.max_entries = max_entries
        self._redis = redis
        self._keys = list(vector_keys(version))
        self._read = redis.register_script(_READ)
        self._write = redis.register_script(_WRITE)

    def get_many(self, hashes: Sequence[str]) -> dict[str, F32]:
        """The vectors known for ``hashes``; any Redis failure reads as nothing known."""
        wanted = list(dict.fromkeys(hashes))
        found: dict[str, F32] = {}
        now = time.time()
        try:
            for start in range(0, len(wanted), _CHUNK):
                part = wanted[start : start + _CHUNK]
                values = self._read(keys=self._keys, args=[now, *part])
                for content_hash, value in zip(part, values, strict=True):
                    # A value of another width (written by another build) is not this vector.
                    if isinstance(value, bytes) and len(value) == 4 * self.dim:
                        found[content_hash] = np.frombuffer(value, dtype=np.float32)
        except RedisError as exc:
            log.warning("passage vectors unreadable, encoding instead: %s", exc)
            return {}
        return found

    def put_many(self, vectors: Mapping[str, F32]) -> None:
        """Keep ``vectors``; a Redis failure is logged and dropped (they are made again)."""
        items = list(vectors.items())
        now = time.time()
        try:
            for start in range(0, len(items), _CHUNK):
                args: list[str | float | int | bytes] = [now, self.max_entries]
                for content_hash, vector in items[start : start + _CHUNK]:
                    args.extend([content_hash, np.ascontiguousarray(vector, np.float32).tobytes()])
                self._write(keys=self._keys, args=args)
        except RedisError as exc:
            log.warning("passage vectors not kept: %s", exc)

    def count(self) -> int:
        """Vectors held now (for tests and figures)."""
        return int(self._redis.hlen(self._keys[0]))
