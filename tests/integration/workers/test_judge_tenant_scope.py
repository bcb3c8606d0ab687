"""Labels the judge gave one tenant are that tenant's: another tenant's identical event costs its
own judge call and gets its own grades, unless the deployment shares derived data across tenants.

The judge is the test's OpenAI-compatible server; its grades change between the two tenants'
events, so a grade reused from the first tenant is told apart from one the second paid for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import col, select

from service.store.engine import session_scope
from service.store.models import Judgment
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.retrievals import Retrieval, store_retrievals
from workers import judging
from workers.judge import make_judge

QUERY = "who wrote the iliad"
PASSAGES = ("Homer wrote the Iliad.", "Troy was in Anatolia.")


def grades(runtime: Runtime, event_pk: int) -> list[tuple[int | None, bool]]:
    with session_scope(runtime.engine) as session:
        rows = session.exec(
            select(Judgment).where(col(Judgment.event_pk) == event_pk).order_by(col(Judgment.rank))
        ).all()
        return [(row.grade, row.from_cache) for row in rows]


@pytest.mark.parametrize("shared", [False, True], ids=["per-tenant", "shared"])
def test_a_second_tenants_identical_event_is_judged_for_it_unless_sharing_is_set(
    tmp_path: Path, sqlite_url: str, redis_url: str, fake_llm: FakeLLM, shared: bool
) -> None:
    settings = make_settings(
        tmp_path,
        sqlite_url,
        redis_url,
        judge_base_url=fake_llm.base_url,
        judge_model="fake-judge",
        judge_max_retries=0,
        share_derived_across_tenants=shared,
    )
    event = Retrieval(QUERY, PASSAGES, 2)
    fake_llm.set_labels({(None, PASSAGES[0]): 3, (None, PASSAGES[1]): 0})
    runtime, (first,) = store_retrievals(settings, [event], "a", tenant="tenant-a")
    judge = make_judge(settings, runtime.redis)
    assert judging.judge_events(runtime, judge, [first]).outcomes == {first: "judged"}
    assert grades(runtime, first) == [(3, False), (0, False)]
    calls_for_a = len(fake_llm.stats()["requests"])

    # The judge now grades the same texts otherwise: a grade of 3 can only be tenant A's.
    fake_llm.set_labels({(None, PASSAGES[0]): 1, (None, PASSAGES[1]): 2})
    _, (second,) = store_retrievals(settings, [event], "b", tenant="tenant-b")
    assert judging.judge_events(runtime, judge, [second]).outcomes == {second: "judged"}
    calls_for_b = len(fake_llm.stats()["requests"]) - calls_for_a

    if shared:
        assert calls_for_b == 0
        assert grades(runtime, second) == [(3, True), (0, True)]
    else:
        assert calls_for_b == 1
        assert grades(runtime, second) == [(1, False), (2, False)]
