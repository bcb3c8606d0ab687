"""A token bucket in Redis, shared by every process: per tenant at ingest, global for the judge.

The check and the spend happen in one Lua script, so parallel callers can never take more than
the bucket holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis import Redis

from service.primitives.keys import redis_key

_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= want then
  tokens = tokens - want
else
  wait = (want - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return tostring(wait)
"""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_seconds: float


class TokenBucket:
    def __init__(
        self, redis: Redis, name: tuple[str, ...], rate_per_second: float, burst: float
    ) -> None:
        self.redis = redis
        self.key = redis_key("rm:ratelimit", *name)
        self.rate = rate_per_second
        self.burst = max(burst, 1.0)
        self._take = redis.register_script(_TAKE)

    def take(self, amount: float = 1.0) -> Decision:
        """Spend ``amount`` tokens if the bucket has them; otherwise say how long to wait."""
        if amount > self.burst:  # a batch larger than the burst could never pass
            amount = self.burst
        wait = float(self._take(keys=[self.key], args=[self.rate, self.burst, time.time(), amount]))
        return Decision(allowed=wait == 0.0, retry_after_seconds=wait)
