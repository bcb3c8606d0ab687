"""The cap on distinct label sets: a tenant's events cannot make /metrics grow without end.

A label set is one (tenant, app, retriever, environment). The first ``per_tenant`` sets a tenant
sends, and the first ``overall`` sets of all tenants together, are admitted and kept for good (a
set in Redis, so every process and replica agrees); the events of any other set are still stored,
judged and scored, but their series are exported with app, retriever and environment set to
``OVERFLOW`` and counted in ``label_sets_overflow_total``. Families labelled by app alone (spend,
pipeline lag) keep an app that at least one admitted set carries.

Each process remembers the answers for ``MEMORY_SECONDS``, so the hot path asks Redis only about
label sets it has not seen lately. If Redis loses the sets, the cap starts counting again.

A set's identity in Redis is its ``composite_key``: label values may hold any character, and two
different sets must never count as one already admitted. The keys carry ``v2`` since the identity
changed; the sets admitted under the former keys are counted afresh.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

from redis import Redis

from service.primitives.keys import composite_key

OVERFLOW = "__overflow__"
SETS_KEY = "rm:metrics:label_sets:v2"
PER_TENANT_KEY = "rm:metrics:label_sets:v2:per_tenant"
APPS_KEY = "rm:metrics:label_sets:v2:apps"
MEMORY_SECONDS = 60.0
K = TypeVar("K")

# Admits a set if it is known, or if both caps leave room; 1 when admitted, 0 when past a cap.
_ADMIT = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return 1
end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[5]) then
  return 0
end
if tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0') >= tonumber(ARGV[4]) then
  return 0
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
redis.call('SADD', KEYS[3], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class LabelSet:
    tenant: str
    app: str
    retriever: str
    environment: str


def label_set_member(labels: LabelSet) -> str:
    """The identity of a label set among the admitted ones."""
    return composite_key(labels.tenant, labels.app, labels.retriever, labels.environment)


def app_member(tenant: str, app: str) -> str:
    """The identity of a tenant's app among the apps of admitted sets."""
    return composite_key(tenant, app)


class LabelSetCap:
    def __init__(self, redis: Redis, per_tenant: int, overall: int) -> None:
        self.redis = redis
        self.per_tenant = per_tenant
        self.overall = overall
        self._admit = redis.register_script(_ADMIT)
        self._sets: dict[LabelSet, tuple[float, bool]] = {}
        self._apps: dict[tuple[str, str], tuple[float, bool]] = {}

    def admits(self, labels: LabelSet) -> bool:
        now = time.monotonic()
        known = self._sets.get(labels)
        if known is not None and now - known[0] < MEMORY_SECONDS:
            return known[1]
        admitted = bool(
            self._admit(
                keys=[SETS_KEY, PER_TENANT_KEY, APPS_KEY],
                args=[
                    label_set_member(labels),
                    labels.tenant,
                    app_member(labels.tenant, labels.app),
                    self.per_tenant,
                    self.overall,
                ],
            )
        )
        self._remember(self._sets, labels, now, admitted)
        if admitted:
            self._remember(self._apps, (labels.tenant, labels.app), now, True)
        return admitted

    def admits_app(self, tenant: str, app: str) -> bool:
        """Whether some admitted label set carries this tenant's app."""
        now = time.monotonic()
        known = self._apps.get((tenant, app))
        if known is not None and now - known[0] < MEMORY_SECONDS:
            return known[1]
        admitted = bool(self.redis.sismember(APPS_KEY, app_member(tenant, app)))
        self._remember(self._apps, (tenant, app), now, admitted)
        return admitted

    def admitted_apps(self, owners: list[tuple[str, str]]) -> list[bool]:
        """``admits_app`` of many (tenant, app) pairs in one round trip (a scrape's gauges)."""
        if not owners:
            return []
        members = [app_member(tenant, app) for tenant, app in owners]
        return [bool(found) for found in self.redis.smismember(APPS_KEY, members)]

    def _remember(
        self, memory: dict[K, tuple[float, bool]], key: K, now: float, value: bool
    ) -> None:
        # Bounded: past the caps, fresh label sets keep coming and must not grow this forever.
        if len(memory) > 4 * (self.overall + 1000):
            memory.clear()
        memory[key] = (now, value)
