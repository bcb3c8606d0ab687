"""A Redis client of the real server that records the commands it sends, pipelined or not:
for tests that hold which commands a piece of code sends, and through which client."""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis


class RecordingPipeline(redis.client.Pipeline):
    """A pipeline of ``RecordingRedis``: records each command it queues."""

    sent: Counter[str]

    def pipeline_execute_command(self, *args: Any, **options: Any) -> redis.client.Pipeline:
        self.sent[str(args[0]).upper()] += 1
        return super().pipeline_execute_command(*args, **options)


class RecordingRedis(redis.Redis):
    """A client of the real server that records the name of each command it sends, pipelined or
    not (scripts included, as EVALSHA)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: Counter[str] = Counter()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent[str(args[0]).upper()] += 1
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        pipe = RecordingPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
        pipe.sent = self.sent
        return pipe
