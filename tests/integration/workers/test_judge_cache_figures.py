"""The LLM judge asks again neither a (query, passage) grade nor a (query, top-k set) context
rating it already has, and the figures say what that saved.

The judge is the test's OpenAI-compatible HTTP server, which keeps every request it answers;
storage is SQLite and the shared aggregates are in the real Redis.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.spend.budget import estimate_prompt_tokens
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.retrievals import Retrieval, store_retrievals
from workers import judging
from workers.judge import make_judge

A, B, C, D = (
    "Homer wrote the Iliad.",
    "Troy was in Anatolia.",
    "Bread needs yeast.",
    "Achilles fought at Troy.",
)
QUERY = "who wrote the iliad"


def sent_passages(body: dict[str, Any]) -> list[str]:
    """The passage texts of one chat request (each is a JSON string after its marker)."""
    user = body["messages"][1]["content"]
    return [json.loads(line.split("] ", 1)[1]) for line in user.splitlines() if line[:2] == "[p"]


def asks_context(body: dict[str, Any]) -> bool:
    return "context" in body["messages"][0]["content"]


def figure(runtime: Runtime, family: str, *labels: str) -> float:
    return sum(
        amount
        for (name, values, _part), amount in runtime.aggregates.read().items()
        if name == family and values[2:] == labels
    )


def test_a_known_context_rating_is_not_asked_again_and_the_savings_are_counted(
    tmp_path: Path, sqlite_url: str, redis_url: str, fake_llm: FakeLLM
) -> None:
    settings = make_settings(
        tmp_path,
        sqlite_url,
        redis_url,
        judge_base_url=fake_llm.base_url,
        judge_model="fake-judge",
        judge_max_retries=0,
    )
    fake_llm.set_labels({(None, A): 3, (None, D): 2})
    events = [
        Retrieval(QUERY, (A, B, C), 2),  # new: every grade and the context rating
        Retrieval(QUERY, (B, A, D), 2),  # the same top-k set in another order, one new passage
        Retrieval(QUERY, (A, B, C), 2),  # seen whole: no call
        Retrieval(QUERY, (A, C, B), 2),  # another top-k set: its rating, so A and C again
    ]
    runtime, pks = store_retrievals(settings, events, "ctx")
    judge = make_judge(settings, runtime.redis)

    for pk in pks:  # one slice each, as events arriving apart would be
        assert judging.judge_events(runtime, judge, [pk]).outcomes == {pk: "judged"}

    requests = fake_llm.stats()["requests"]
    assert [(sent_passages(r), asks_context(r)) for r in requests] == [
        ([A, B, C], True),
        ([D], False),
        ([A, C], True),
    ]

    who = ("default", judge.identity.judge)
    assert figure(runtime, "judge_cache_lookups", "context", "hit") == 2
    assert figure(runtime, "judge_cache_lookups", "context", "miss") == 2
    # Label hits by position: none, A and B, all three, B.
    assert figure(runtime, "judge_cache_lookups", "label", "hit") == 6
    assert figure(runtime, "judge_cache_lookups", "label", "miss") == 6
    assert runtime.aggregates.read()[("judge_calls_saved", who, "")] == 1
    overhead = settings.judge_prompt_token_overhead

    def cost(*texts: str) -> int:
        return estimate_prompt_tokens([QUERY, *texts], overhead) if texts else 0

    saved = (cost(A, B, D) - cost(D)) + cost(A, B, C) + (cost(A, C, B) - cost(A, C))
    assert runtime.aggregates.read()[("judge_tokens_saved", who, "")] == saved
    # An LLM judge has no vectors to count.
    assert figure(runtime, "judge_cache_lookups", "vector", "hit") == 0
