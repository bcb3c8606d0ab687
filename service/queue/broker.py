"""The judge queue's broker seen from outside Celery: whether it is a Redis (whose lists the
service reads and writes directly) or another broker such as RabbitMQ (reached through kombu),
how many messages wait in a queue, and whether it answers.

A Redis broker keeps each queue as a list, so its depth is one LLEN and its waiting messages can
be read without taking them. An AMQP broker tells a queue's ready messages (a passive declare)
but lets no one read them without consuming them: what waits is known as a count only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from kombu.connection import Connection
from redis import Redis

# kombu has no type hints.
_Connection: Any = Connection

REDIS_SCHEMES = frozenset({"redis", "rediss", "unix", "redis+socket"})
# A scrape or a sweep must not hang on a broker that does not answer.
CONNECT_SECONDS = 5.0


def is_redis_url(url: str) -> bool:
    return urlsplit(url).scheme in REDIS_SCHEMES


class BrokerQueues:
    """Read-only views of the judge queues on the broker at ``url`` (through ``redis`` when it
    is given: the client a process already holds for that same Redis)."""

    def __init__(self, url: str, redis: Redis | None = None) -> None:
        self.url = url
        self.redis: Redis | None = None
        if is_redis_url(url):
            self.redis = redis or Redis.from_url(
                url, socket_timeout=CONNECT_SECONDS, socket_connect_timeout=CONNECT_SECONDS
            )

    def depths(self, queues: Sequence[str]) -> dict[str, int]:
        """Messages waiting (not yet taken by a worker) in each of ``queues``; a queue the
        broker does not know holds none."""
        if self.redis is not None:
            # One round trip for all: every round trip of a scrape adds to its time.
            with self.redis.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.llen(queue)
                counts = pipe.execute()
            return {queue: int(count) for queue, count in zip(queues, counts, strict=True)}
        with self._connection() as connection:  # one connection for all: a scrape reads two
            return {queue: _ready(connection, queue) for queue in queues}

    def ping(self) -> None:
        """Raise if the broker does not answer."""
        if self.redis is not None:
            self.redis.ping()
            return
        with self._connection() as connection:
            connection.ensure_connection(max_retries=1)

    def _connection(self) -> Any:
        return _Connection(self.url, connect_timeout=CONNECT_SECONDS)


def _ready(connection: Any, queue: str) -> int:
    """The ready messages of ``queue``, by a passive declare on a channel of its own (the broker
    closes the channel when the queue does not exist)."""
    channel = connection.channel()
    try:
        _name, ready, _consumers = channel.queue_declare(queue=queue, passive=True)
    except connection.channel_errors:  # NOT_FOUND: nothing was ever sent to it
        return 0
    finally:
        if channel.is_open:
            channel.close()
    return int(ready)
