"""What the scrape-time and rebuild code of telemetry needs of a process: its settings, database
engine, Redis and aggregates. A structural type, so telemetry names no room above it; the
wiring's ``Runtime`` is one."""

from __future__ import annotations

from typing import Protocol

from redis import Redis
from sqlalchemy import Engine

from service.config.settings import Settings
from service.queue.broker import BrokerQueues
from service.telemetry.aggregates import Aggregates


class ProcessParts(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def redis(self) -> Redis: ...

    @property
    def aggregates(self) -> Aggregates: ...

    @property
    def broker_queues(self) -> BrokerQueues: ...
