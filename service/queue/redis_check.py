"""Refuse a Redis that may silently drop queued tasks."""

from __future__ import annotations

from redis import Redis
from redis.exceptions import ResponseError


def eviction_problem(redis: Redis) -> str | None:
    """A message when Redis may evict the task queue to free memory, else None.

    Only the ``allkeys-*`` policies can evict a queue (its lists have no TTL, so ``volatile-*``
    never touches them), and only when ``maxmemory`` is set.
    """
    try:
        config = redis.config_get("maxmemory*")
    except ResponseError:
        return None  # managed Redis services often forbid CONFIG; nothing to check then
    policy = str(config.get("maxmemory-policy", "noeviction"))
    limit = int(config.get("maxmemory", 0) or 0)
    if limit > 0 and policy.startswith("allkeys"):
        return (
            f"Redis evicts keys under memory pressure (maxmemory-policy {policy}, maxmemory "
            f"{limit}): queued judge tasks could be dropped. Set maxmemory-policy to noeviction "
            "(or a volatile-* policy) on the broker."
        )
    return None
