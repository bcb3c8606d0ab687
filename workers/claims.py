"""Claims on the events a worker is judging, so that two deliveries of one event never both pay
for a judge call.

An event can be delivered twice: the sweeper re-sends one whose message a worker took just before
it looked, Redis redelivers a task whose acknowledgement was lost, a client's resend races its
original. The score's unique key keeps the counts right whatever happens, but the judge call is
paid before that key is reached. A claim is a Redis key set only if absent (one round trip for a
slice); a delivery that finds its event claimed leaves it to the holder.

A claim names its holder (host and process). A pool process killed mid-task leaves claims whose
holder is gone: the delivery Celery makes again on that host sees it and takes them over at once.
Elsewhere, a claim expires after ``ttl_seconds``. While the holder judges, a thread of its own
renews its claims every third of that time, so a judge call (with its retries) longer than the
lifetime is never taken up by a second delivery; a holder that dies or hangs in a way that stops the
thread stops renewing, and its claims expire as before. The holder releases its claims as soon as
the slice is stored. The sweeper reads the claims too: a claimed event is being judged, not lost.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from redis import Redis
from redis.exceptions import RedisError

from service.primitives.keys import redis_key
from service.store.judging import JudgeIdentity

# Deletes each key only if it still holds this holder's token: a claim that expired and was
# taken by another delivery is theirs to release.
_RELEASE = """
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('DEL', key) end
end
return 0
"""
# Extends each key that still holds this holder's token; returns how many it extended.
_RENEW = """
local renewed = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    renewed = renewed + 1
  end
end
return renewed
"""
# Replaces a dead holder's claim, unless someone else replaced it first.
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


log = logging.getLogger(__name__)


def holder_is_gone(token: str, host: str | None = None) -> bool:
    """True if the claim's holder was a process of this host that no longer runs."""
    holder_host, _, rest = token.partition("|")
    pid_text = rest.partition("|")[0]
    if holder_host != (host or socket.gethostname()) or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, under another user
        return False
    return False


class EventClaims:
    def __init__(self, redis: Redis, who: JudgeIdentity, ttl_seconds: float) -> None:
        self.redis = redis
        self.who = who
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self.token = f"{socket.gethostname()}|{os.getpid()}|{uuid.uuid4().hex[:12]}"

    def take(self, event_pks: Sequence[int]) -> list[int]:
        """The events of ``event_pks`` this holder now claims; the others are being judged."""
        if not event_pks:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for pk in event_pks:
                pipe.set(self._key(pk), self.token, nx=True, px=self.ttl_ms)
            taken = pipe.execute()
        claimed = [pk for pk, ok in zip(event_pks, taken, strict=True) if ok]
        refused = [pk for pk, ok in zip(event_pks, taken, strict=True) if not ok]
        for pk, holder in self._holders(refused).items():
            if holder_is_gone(holder) and self.redis.eval(
                _TAKE_OVER, 1, self._key(pk), holder, self.token, self.ttl_ms
            ):
                claimed.append(pk)
        return claimed

    def held(self, event_pks: Sequence[int]) -> set[int]:
        """The events of ``event_pks`` a live delivery is judging now."""
        return {pk for pk, holder in self._holders(event_pks).items() if not holder_is_gone(holder)}

    @contextmanager
    def kept(self, event_pks: Sequence[int]) -> Iterator[None]:
        """Hold the claims on ``event_pks`` while the block runs, then release them."""
        stop = threading.Event()
        renewer = threading.Thread(
            target=self._renew_until,
            args=(list(event_pks), stop),
            name="claim-renewal",
            daemon=True,
        )
        if event_pks:
            renewer.start()
        try:
            yield
        finally:
            stop.set()
            if renewer.is_alive():
                renewer.join()
            self.release(event_pks)

    def renew(self, event_pks: Sequence[int]) -> int:
        """Give this holder's claims on ``event_pks`` a full lifetime again.

        Returns how many of them it still held."""
        if not event_pks:
            return 0
        keys = [self._key(pk) for pk in event_pks]
        return int(self.redis.eval(_RENEW, len(keys), *keys, self.token, self.ttl_ms))

    def _renew_until(self, event_pks: list[int], stop: threading.Event) -> None:
        while not stop.wait(self.ttl_ms / 3000):
            try:
                self.renew(event_pks)
            except RedisError as exc:
                # Redis is away: the claims may lapse and a second delivery may ask the judge
                # again, which costs a call but loses nothing (the score's unique key holds).
                log.warning("could not renew judging claims", extra={"error": str(exc)})

    def release(self, event_pks: Sequence[int]) -> None:
        if event_pks:
            self.redis.eval(_RELEASE, len(event_pks), *map(self._key, event_pks), self.token)

    def _holders(self, event_pks: Sequence[int]) -> dict[int, str]:
        if not event_pks:
            return {}
        values = self.redis.mget([self._key(pk) for pk in event_pks])
        return {
            pk: value.decode() if isinstance(value, bytes) else str(value)
            for pk, value in zip(event_pks, values, strict=True)
            if value is not None
        }

    def _key(self, pk: int) -> str:
        return redis_key("judging", self.who.judge, self.who.prompt_version, str(pk))
