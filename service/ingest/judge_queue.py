"""The judge queue: the one push that enqueues
judging, with the ingest counters in the same Redis round trip when they share the broker.

Tasks are sent by name: the service never imports the workers' code. Small sends may be
gathered: the events of requests that arrive close together go to the workers in one message
of up to a slice. A worker judges a slice at a fixed cost plus a small cost per event (one load,
one transaction, one export), so a message per single-event request made a steady trickle of
events cost several times the CPU of the same events in slices, and the judging lag grew from
queueing behind that overhead. Waiting a fraction of a second to gather them costs that fraction
in lag.

On a Redis broker the API processes gather into one list on the broker (``gathering_list``), so
a slice fills at the rate of all of them together: gathered per process, N processes each filled
a slice N times slower, sent smaller slices on the timer and cost the workers more per event.
The append rides in the request's round trip with its counters and takes every whole slice the
list then holds; what is left goes when the appending process's timer of ``gather_seconds``
fires, or earlier with another process's. On any other broker each process gathers its own.

The events are committed before they are pushed or handed over to be gathered; a message that is
never sent (the process killed while it waits, the broker down) leaves them pending, and the
sweeper sends them.

On a Redis broker the message is written here in Celery's own format (a test holds it to what
Celery itself writes, field by field) and pushed with one LPUSH; on any other broker, RabbitMQ
say, it goes through Celery's own publishing (``service/queue/celery_sender.py``). The tasks'
names and the message itself live in ``service/queue``, which the workers share.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from celery import Celery
from redis import Redis
from redis.exceptions import NoScriptError

from service.ingest.counts import add_counts
from service.ingest.gathering import GATHER_SCRIPT, TAKE_SCRIPT, TAKE_SLICES, event_key
from service.primitives.background import BackgroundWorker
from service.queue.broker import is_redis_url
from service.queue.celery_sender import celery_sender
from service.queue.messages import judge_message, slices
from service.queue.names import gathering_list, gathering_since, urgent_queue
from service.queue.tasks import FANOUT_TASK, JUDGE_SLICE_TASK
from service.telemetry.aggregates import Aggregates, Delta

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CounterUpdate:
    """Counters to add along with a push: in its round trip when ``redis_url`` is the broker's
    (``aggregates`` is on that Redis), else on their own."""

    aggregates: Aggregates
    redis_url: str
    delta: Delta


class JudgeQueue:
    """The judge messages of one process, pushed to the broker's list ``queue`` (urgent ones to
    its urgent twin); sends smaller than a slice wait up to ``gather_seconds`` for company: on a
    Redis broker in a list all API processes share, elsewhere in this process."""

    def __init__(
        self, broker_url: str, queue: str, slice_events: int = 16, gather_seconds: float = 0.0
    ) -> None:
        self.broker_url = broker_url
        self.queue = queue
        self.slice_events = slice_events
        self.gather_seconds = gather_seconds
        # A broker outage must not hang the ingest request: the event is already committed and
        # the sweeper re-enqueues it, so one quick attempt with a bounded wait is enough.
        self.redis: Redis | None = None
        self.sender: Celery | None = None
        if is_redis_url(broker_url):
            self.redis = Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
        else:
            self.sender = celery_sender(broker_url)
        self.gathering_key = gathering_list(queue)
        self._gathering_keys = [self.gathering_key, gathering_since(queue)]
        # Unconnected without a Redis broker: never called then.
        scripts_on = self.redis or Redis()
        self._gather_script = scripts_on.register_script(GATHER_SCRIPT)
        self._take_script = scripts_on.register_script(TAKE_SCRIPT)
        self._closed = False
        # Without a Redis broker: the sends held in this process, a slice going when it is full.
        self._gathering: BackgroundWorker[int] = BackgroundWorker(
            "judge-dispatch",
            self._push_slices,
            gather_seconds,
            wait_for_work=True,
            batch=slice_events,
        )
        # With one: a timer armed by an append that left events in the shared list, which takes
        # what the list holds once it fires (the items are only its arming).
        self._shared_timer: BackgroundWorker[bool] = BackgroundWorker(
            "judge-gather-timer",
            self._send_gathered,
            gather_seconds,
            wait_for_work=True,
            capacity=1,
        )

    def push(
        self,
        event_pks: Sequence[int],
        urgent_pks: Sequence[int] = (),
        counters: CounterUpdate | None = None,
    ) -> bool:
        """Enqueue judging of ``event_pks`` (and of ``urgent_pks`` on the urgent queue), with
        ``counters`` in the same round trip where they share the broker; False if the broker
        refused a message (the sweeper will send it). A send smaller than a slice may be held to
        gather it with later ones: it is handed over, and the flush reports its own failures.
        """
        sends: list[tuple[str, list[int]]] = []
        if urgent_pks:
            sends.append((urgent_queue(self.queue), list(urgent_pks)))
        gathered: list[int] = []
        if event_pks and not self.sends_now(event_pks):
            if self.redis is not None:
                gathered = list(event_pks)
                held = True
            else:  # held here to be gathered, unless this sender is closed
                held = self._gathering.put(event_pks) > 0
        else:
            held = False
        if event_pks and not held:
            sends.append((self.queue, list(event_pks)))
        if counters is None or counters.redis_url != self.broker_url or self.redis is None:
            if counters is not None:
                add_counts(counters.aggregates, counters.delta)
            sent = all([self._send(queue, pks) for queue, pks in sends])
            return self._gather(gathered) and sent
        pushes = [(queue, self.judge_messages(pks, queue)) for queue, pks in sends]
        return self._push_with_counters(pushes, counters, gathered)

    def close(self) -> None:
        """Send what is held now (at shutdown); later sends go at once."""
        self._closed = True
        self._gathering.close()
        self._shared_timer.close()
        if self.sender is not None:
            self.sender.close()  # its pooled broker connections

    def judge_messages(self, event_pks: Sequence[int], queue: str | None = None) -> list[bytes]:
        """The messages for ``queue`` (default: this sender's) that ask judging of
        ``event_pks``: none, or one.

        A request costs one message: up to a slice goes straight to a judge task; a larger
        batch goes to a worker that cuts it into slices, so several processes share it.
        """
        if not event_pks:
            return []
        return [judge_message(self.task_for(event_pks), event_pks, queue or self.queue)]

    def task_for(self, event_pks: Sequence[int]) -> str:
        """Up to a slice goes straight to a judge task; more to a worker that cuts it."""
        return JUDGE_SLICE_TASK if len(event_pks) <= self.slice_events else FANOUT_TASK

    def sends_now(self, event_pks: Sequence[int]) -> bool:
        """Whether ``push(event_pks)`` goes to the broker at once rather than being held."""
        return self.gather_seconds <= 0 or len(event_pks) >= self.slice_events or self._closed

    def _push_slices(self, held: list[int]) -> None:
        for part in slices(held, self.slice_events):
            self._send(self.queue, part)

    def _gather(self, event_pks: list[int]) -> bool:
        """Append ``event_pks`` to the shared list on its own round trip (the counters go
        elsewhere) and send the whole slices that completes; False if the broker refused."""
        if not event_pks:
            return True
        assert self.redis is not None
        try:
            answer = self._gather_script(
                keys=self._gathering_keys, args=[self.slice_events, *event_pks]
            )
        except Exception:  # the events are committed; the sweeper re-sends them
            log.warning(
                "could not gather %d event(s) for judging; the sweeper will send them",
                len(event_pks),
                exc_info=True,
            )
            return False
        return self._after_gathering(answer)

    def _after_gathering(self, answer: tuple[int, list[bytes]]) -> bool:
        """Send the whole slices an append took (the script's ``{left, taken}``), and arm the
        timer for what it left."""
        left, taken = answer
        sent = self._push_slices_now(taken)
        if left > 0:
            self._shared_timer.put([True])  # already armed: refused, and that is as well
        return sent

    def _send_gathered(self, _armed: list[bool]) -> None:
        """The timer fired: take and send everything the shared list holds, whichever process
        appended it."""
        most = TAKE_SLICES * self.slice_events
        wait_ms = round(self.gather_seconds * 1000) if not self._closed else 0
        while True:
            left_ms, taken = self._take_script(keys=self._gathering_keys, args=[most, wait_ms])
            if left_ms > 0:  # the oldest arrived after this timer was armed: wait for it
                time.sleep(left_ms / 1000)
                continue
            self._push_slices_now(taken)
            if len(taken) < most:
                return

    def _push_slices_now(self, raw_pks: Sequence[bytes | str | int]) -> bool:
        """Messages for the event keys taken from the shared list, a slice each (anything that
        is not an event key, which only a hand-edited list could hold, is passed over)."""
        event_pks = [pk for pk in map(event_key, raw_pks) if pk is not None]
        return all([self._send(self.queue, part) for part in slices(event_pks, self.slice_events)])

    def _send(self, queue: str, event_pks: list[int]) -> bool:
        """One message asking judging of ``event_pks`` on ``queue``, through whichever broker."""
        if not event_pks:
            return True
        try:
            if self.redis is not None:
                self.redis.lpush(queue, *self.judge_messages(event_pks, queue))
            else:
                assert self.sender is not None
                self.sender.send_task(self.task_for(event_pks), args=[event_pks], queue=queue)
        except Exception:  # the events are committed; the sweeper re-sends them
            log.warning(
                "could not enqueue judging of %d event(s) on %s; the sweeper will",
                len(event_pks),
                queue,
                exc_info=True,
            )
            return False
        return True

    def _push_with_counters(
        self,
        pushes: list[tuple[str, list[bytes]]],
        counters: CounterUpdate,
        gathered: list[int],
    ) -> bool:
        """The counters, the messages and the append of ``gathered`` to the shared list in one
        pipeline on the counters' client (the broker's Redis)."""
        try:
            pipe = counters.aggregates.redis.pipeline(transaction=False)
            counted = counters.aggregates.add_in(pipe, counters.delta)
            for queue, messages in pushes:
                pipe.lpush(queue, *messages)
            if gathered:
                # By its SHA only, as the counters' script: a restarted Redis answers
                # NoScriptError, and the append is made again on its own (which loads it).
                pipe.evalsha(
                    self._gather_script.sha, 2, *self._gathering_keys, self.slice_events, *gathered
                )
            answers = pipe.execute(raise_on_error=False)
        except Exception:  # committed already: the counters are rebuilt, the sweeper re-sends
            log.warning(
                "could not update ingest counters nor enqueue judging; the sweeper will",
                exc_info=True,
            )
            return False
        if counted:
            if isinstance(answers[0], NoScriptError):  # a restarted Redis: load the script
                add_counts(counters.aggregates, counters.delta)
            elif isinstance(answers[0], Exception):
                log.warning("could not update ingest counters: %s", answers[0])
            answers = answers[1:]
        pushed = True
        if gathered:
            answers, appended = answers[:-1], answers[-1]
            if isinstance(appended, NoScriptError):
                pushed = self._gather(gathered)
            elif isinstance(appended, Exception):
                pushed = False
                log.warning(
                    "could not gather %d event(s) for judging; the sweeper will send them: %s",
                    len(gathered),
                    appended,
                )
            else:
                pushed = self._after_gathering(appended)
        for (queue, messages), answer in zip(pushes, answers, strict=True):
            if isinstance(answer, Exception):
                pushed = False
                log.warning(
                    "could not enqueue %d judge message(s) on %s; the sweeper will: %s",
                    len(messages),
                    queue,
                    answer,
                )
        return pushed
