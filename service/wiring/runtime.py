"""The long-lived parts a process needs (database engine, Redis, task sender), built once from
the settings and handed to routes and tasks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from redis import Redis
from sqlalchemy import Engine

from service.config.settings import Settings
from service.contract.redaction import Redactor
from service.queue.broker import BrokerQueues
from service.store.engine import get_engine
from service.telemetry.aggregates import Aggregates
from service.telemetry.cardinality import LabelSetCap


@dataclass
class Runtime:
    settings: Settings

    @cached_property
    def engine(self) -> Engine:
        return get_engine(self.settings.database_url)

    @cached_property
    def redis(self) -> Redis:
        if not self.settings.redis_url:
            raise RuntimeError(
                "RM_REDIS_URL is empty: run `retrieval-monitor serve`, which starts an embedded "
                "Redis, or set RM_REDIS_URL to a Redis server"
            )
        return Redis.from_url(self.settings.redis_url, socket_timeout=5, socket_connect_timeout=5)

    @cached_property
    def broker_queues(self) -> BrokerQueues:
        """The judge queues as the broker holds them (the Redis above unless RM_BROKER_URL)."""
        same = self.settings.judge_broker_url == self.settings.redis_url
        return BrokerQueues(self.settings.judge_broker_url, self.redis if same else None)

    @cached_property
    def redactor(self) -> Redactor:
        return Redactor.from_settings(self.settings.redact)

    @cached_property
    def aggregates(self) -> Aggregates:
        cap = LabelSetCap(
            self.redis, self.settings.max_label_sets_per_tenant, self.settings.max_label_sets
        )
        return Aggregates(self.redis, cap)
