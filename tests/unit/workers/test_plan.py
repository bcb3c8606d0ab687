"""What a slice asks the judge, planned from the stored passages and the known labels alone."""

from __future__ import annotations

from datetime import UTC, datetime

from service.primitives.hashing import text_hash
from service.store.judging import EventForJudging, PassageForJudging
from workers.judge.base import JudgeReply
from workers.plan import (
    EventWork,
    context_cache_key,
    judge_request,
    learn,
    plan_call,
    plan_events,
    split_round,
)

TEXTS = ("Homer wrote the Iliad.", "Troy was in Anatolia.", "Bread needs yeast.")


def event(pk: int, texts: tuple[str, ...], k: int) -> EventForJudging:
    return EventForJudging(
        pk=pk,
        event_id=f"ev-{pk}",
        tenant="acme",
        app="shop",
        retriever="bm25",
        environment="",
        query="who wrote the iliad",
        k=k,
        status="pending",
        received_at=datetime.now(UTC),
        gold_passage_ids=None,
        passages=[
            PassageForJudging(rank, f"d{rank}", text, text_hash(text))
            for rank, text in enumerate(texts, start=1)
        ],
    )


def work(one: EventForJudging) -> EventWork:
    return EventWork(one, text_hash(one.query), context_cache_key(one))


def test_the_context_rating_puts_the_whole_top_k_in_front_of_the_judge() -> None:
    one = event(1, TEXTS, 2)
    cached = {text_hash(TEXTS[0]): 3, text_hash(TEXTS[1]): 0}
    plan = plan_call(one, cached)
    assert plan.rate_context
    assert plan.send == [0, 1, 2]


def test_a_cached_rating_leaves_only_the_unknown_passages_once_each() -> None:
    one = event(1, (*TEXTS, TEXTS[2]), 2)
    cached = {context_cache_key(one): 2, text_hash(TEXTS[0]): 3}
    plan = plan_call(one, cached)
    assert not plan.rate_context
    assert plan.send == [1, 2]  # the repeated third text goes once
    request = judge_request(one, plan, "acme")
    assert request.passages == TEXTS[1:]
    assert request.top_k_count == 0
    assert request.scope == "acme"


def test_the_context_key_is_the_top_k_set_whatever_its_order() -> None:
    assert context_cache_key(event(1, TEXTS, 2)) == context_cache_key(
        event(2, (TEXTS[1], TEXTS[0], TEXTS[2]), 2)
    )
    assert context_cache_key(event(1, TEXTS, 2)) != context_cache_key(event(2, TEXTS, 3))


def test_an_event_needing_a_label_another_asks_waits_a_round_and_finds_it_known() -> None:
    first, second = work(event(1, TEXTS, 2)), work(event(2, TEXTS[:1], 1))
    # Both context ratings are known: only the passages' grades are asked.
    known = {
        (first.scope, first.query_hash, first.ctx_key): 2,
        (second.scope, second.query_hash, second.ctx_key): 1,
    }
    plan_events([first, second], known)
    this_round, deferred = split_round([first, second])
    assert this_round == [first]
    assert deferred == [second]

    first.reply = JudgeReply((3, 0, None), None, 1, 10, 5, 0, 0.1)
    learn(first, known)
    plan_events(deferred, known)
    assert second.cached == {text_hash(TEXTS[0]): 3, second.ctx_key: 1}
    assert second.plan.send == []
    assert split_round(deferred) == ([second], [])
    assert second.label_hits() == 1
