"""What a slice asks the judge, decided from its events as stored and the labels already known
(the label cache, then what the slice's earlier calls answered). No I/O.

For one event: the passages whose grade is not known (a text repeated in the event goes once) and
whether the top k's context rating is wanted, which puts the whole top k in front of the judge.
For the slice: which events are asked in which round, so that two events needing the same
(query, passage) label never both pay for it: the later one waits a round and finds it known.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from service.primitives.keys import digest_key
from service.store.judging import EventForJudging
from workers.judge.base import JudgeReply
from workers.judge.prompt import JudgeRequest

# (tenant scope, query hash, passage hash or context key) -> grade or context rating; the scope
# (``derived_scope``) keeps one tenant's labels from answering another's, within a slice too.
KnownLabels = dict[tuple[str, str, str], int]


def context_cache_key(event: EventForJudging) -> str:
    # The rating is of the set of passages the prompt carries, whatever their order.
    top_k = sorted(p.content_hash for p in event.passages[: event.k])
    return "ctx:" + hashlib.sha256(digest_key(*top_k).encode()).hexdigest()


@dataclass(frozen=True)
class Plan:
    """Which passages go to the judge (indexes into event.passages) and whether to rate context."""

    send: list[int]
    rate_context: bool


def plan_call(event: EventForJudging, cached: dict[str, int]) -> Plan:
    rate_context = context_cache_key(event) not in cached
    top_k = range(min(event.k, len(event.passages)))
    # The context rating needs the whole top-k in front of the judge, cached or not.
    send = list(top_k) if rate_context else []
    seen = {event.passages[i].content_hash for i in send}
    for index, passage in enumerate(event.passages):
        if index in send:
            continue
        if passage.content_hash not in cached and passage.content_hash not in seen:
            send.append(index)
            seen.add(passage.content_hash)
    return Plan(send=send, rate_context=rate_context)


@dataclass
class EventWork:
    """One event on its way through the slice: its plan, then the judge's reply to it."""

    event: EventForJudging
    query_hash: str
    ctx_key: str
    scope: str = ""  # whose derived data its labels are (``derived_scope``)
    cached: dict[str, int] = field(default_factory=dict)  # labels known before its call
    plan: Plan = field(default_factory=lambda: Plan([], False))
    reply: JudgeReply | None = None

    def sent_hashes(self) -> set[str]:
        return {self.event.passages[i].content_hash for i in self.plan.send}

    def label_hits(self) -> int:
        """Its passages whose grade came from the labels known before its call."""
        sent = self.sent_hashes()
        return sum(
            p.content_hash in self.cached and p.content_hash not in sent
            for p in self.event.passages
        )


def plan_events(work: Sequence[EventWork], known: KnownLabels) -> None:
    """Plan each event's call from the labels known now."""
    for item in work:
        item.cached = _cached_for(item, known)
        item.plan = plan_call(item.event, item.cached)


def split_round(pending: Sequence[EventWork]) -> tuple[list[EventWork], list[EventWork]]:
    """The planned events asked this round, and those deferred because an earlier event of the
    round asks one of their labels."""
    claimed: set[tuple[str, str, str]] = set()
    this_round: list[EventWork] = []
    deferred: list[EventWork] = []
    for item in pending:
        passages = item.event.passages
        keys = {(item.scope, item.query_hash, passages[i].content_hash) for i in item.plan.send}
        if item.plan.rate_context:
            keys.add((item.scope, item.query_hash, item.ctx_key))
        if keys & claimed:
            deferred.append(item)
            continue
        claimed |= keys
        this_round.append(item)
    return this_round, deferred


def learn(item: EventWork, known: KnownLabels) -> None:
    """Make the grades of ``item``'s reply visible to the slice's later events."""
    assert item.reply is not None
    for index, grade in zip(item.plan.send, item.reply.grades, strict=True):
        if grade is not None:
            known[(item.scope, item.query_hash, item.event.passages[index].content_hash)] = grade
    if item.plan.rate_context and item.reply.context_rating is not None:
        known[(item.scope, item.query_hash, item.ctx_key)] = item.reply.context_rating


def judge_request(event: EventForJudging, plan: Plan, scope: str) -> JudgeRequest:
    return JudgeRequest(
        query=event.query,
        passages=tuple(event.passages[i].text for i in plan.send),
        rate_context=plan.rate_context,
        top_k_count=min(event.k, len(event.passages)) if plan.rate_context else 0,
        scope=scope,
    )


def _cached_for(item: EventWork, known: KnownLabels) -> dict[str, int]:
    cached: dict[str, int] = {}
    for key in [p.content_hash for p in item.event.passages] + [item.ctx_key]:
        grade = known.get((item.scope, item.query_hash, key))
        if grade is not None:
            cached[key] = grade
    return cached
