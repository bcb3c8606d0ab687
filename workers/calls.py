"""The slice's judge calls: several in flight at once on the process's threads, each within its
tenant's app's budget (reserved before the call, settled against what it cost) and the judge rate
every worker shares.

Before the first call the judge is told everything the slice will ask (``Judge.prepare``): the
local judge encodes it in one encoder call, reading the passage vectors other slices kept.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from service.queue.ratelimit import TokenBucket
from service.spend.budget import BudgetExhaustedError, reserve_call, settle_call
from service.telemetry.aggregates import Delta
from service.wiring.runtime import Runtime
from workers.judge.base import Judge, JudgeReply, TransientJudgeError, VectorUse
from workers.plan import EventWork, KnownLabels, judge_request, learn, plan_events, split_round


@dataclass
class SliceCalls:
    """What the slice's judge calls have given so far."""

    known: KnownLabels
    spend: Delta = field(default_factory=Delta)
    finished: list[EventWork] = field(default_factory=list)  # answered, or nothing to ask
    transient: dict[int, TransientJudgeError] = field(default_factory=dict)
    over_budget: dict[int, BudgetExhaustedError] = field(default_factory=dict)
    vectors: VectorUse | None = None  # where the local judge found the slice's vectors

    def take(
        self, item: EventWork, answer: Callable[[], tuple[JudgeReply, Delta]], *, final: bool
    ) -> bool:
        """Record one call's outcome; False if the budget refused it and ``final`` is not set."""
        pk = item.event.pk
        try:
            reply, spent = answer()
        except TransientJudgeError as exc:
            self.transient[pk] = exc
            return True
        except BudgetExhaustedError as exc:
            if not final:
                return False
            self.over_budget[pk] = exc
            return True
        self.spend.merge(spent)
        item.reply = reply
        learn(item, self.known)
        self.finished.append(item)
        return True


def call_judge(
    runtime: Runtime, judge: Judge, work: list[EventWork], known: KnownLabels
) -> SliceCalls:
    """Grade what ``known`` (the label cache) does not hold, in rounds, several calls at once.

    Two events of a slice that need the same (query, passage) label must not both pay for it:
    the later one waits a round and finds it known, exactly as if the slice ran one event at a
    time. The finished events come back with their plans and replies, ready to store; the events
    the judge failed or the budget refused, by event, unwritten.
    """
    calls = SliceCalls(known)
    # Everything the slice may ask, announced at once: the local judge encodes it in one call.
    # Later rounds only ask less (what an earlier round taught is known by then).
    plan_events(work, known)
    prepared = judge.prepare(
        [judge_request(item.event, item.plan, item.scope) for item in work if item.plan.send]
    )
    calls.vectors = prepared.vectors
    judge = prepared.judge
    pending = work
    while pending:
        this_round, pending = split_round(pending)
        calls.finished.extend(item for item in this_round if not item.plan.send)
        asking = [item for item in this_round if item.plan.send]
        if len(asking) == 1 or judge.max_concurrency == 1:
            for item in asking:
                calls.take(item, partial(_ask, runtime, judge, item), final=True)
        elif asking:
            pool = _call_pool(judge.max_concurrency)
            futures = [(item, pool.submit(_ask, runtime, judge, item)) for item in asking]
            refused = [item for item, f in futures if not calls.take(item, f.result, final=False)]
            # Refused while the slice's other calls held reservations: asked again one at a
            # time, now that those are settled, so concurrency never spends a budget early.
            for item in refused:
                calls.take(item, partial(_ask, runtime, judge, item), final=True)
        plan_events(pending, calls.known)
    return calls


_pool: tuple[int, int, ThreadPoolExecutor] | None = None


def _call_pool(size: int) -> ThreadPoolExecutor:
    """The process's threads for judge calls, made on first use (after Celery forks the process:
    threads do not survive a fork) and kept, since starting them per slice cost more than the
    calls they overlapped."""
    global _pool
    if _pool is None or _pool[0] != os.getpid() or _pool[1] != size:
        _pool = (os.getpid(), size, ThreadPoolExecutor(size, thread_name_prefix="judge-call"))
    return _pool[2]


def _ask(runtime: Runtime, judge: Judge, item: EventWork) -> tuple[JudgeReply, Delta]:
    """One judge call for one event, within its tenant's app's budget and the shared call
    rate."""
    event, who = item.event, judge.identity
    request = judge_request(event, item.plan, item.scope)
    held = reserve_call(
        runtime, event.tenant, event.app, who.model, [event.query, *request.passages]
    )
    try:
        wait_for_judge_budget(runtime)
        reply = judge.judge(request)
    except BaseException:  # a call that never answered releases its reservation
        settle_call(runtime, held, event.tenant, event.app, who.judge, who.model, 0, 0, 0)
        raise
    spent = settle_call(
        runtime,
        held,
        event.tenant,
        event.app,
        who.judge,
        who.model,
        reply.calls,
        reply.prompt_tokens,
        reply.completion_tokens,
    )
    return reply, spent


def wait_for_judge_budget(runtime: Runtime, sleep: Callable[[float], None] = time.sleep) -> None:
    """Hold the call until the shared judge rate allows it (all workers draw on one bucket)."""
    rate = runtime.settings.judge_calls_per_second
    if rate <= 0:
        return
    bucket = TokenBucket(runtime.redis, ("judge",), rate, burst=max(1.0, rate))
    while not (decision := bucket.take()).allowed:
        sleep(min(decision.retry_after_seconds, 5.0))
