"""The LLM judge's output modes, per-passage and shuffled judging, against an OpenAI-compatible
HTTP server (tests/fake_llm) and the real Redis.

The fake server grades by (query, passage) text, whatever the position or the batch: these tests
prove the protocol (what is sent, what is parsed, what is remembered and counted), not a judge's
quality.

Tests ``workers.judge.llm``, ``workers.judge.output_mode`` and ``workers.judge.base``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import redis

from service.config.settings import Settings
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import store_event
from workers import judging
from workers.judge import make_judge
from workers.judge.base import TransientJudgeError
from workers.judge.llm import LlmJudge
from workers.judge.output_mode import forget_known_modes, is_format_rejection, mode_key
from workers.judge.prompt import PROMPT_VERSION, JudgeRequest, reply_schema

QUERY = "who wrote the iliad"
TEXTS = (
    "Homer is the author of the Iliad and the Odyssey.",
    "The Iliad is set during the Trojan War.",
    "Troy was a city in Anatolia.",
    "Bread rises because yeast makes carbon dioxide.",
    "Achilles is the hero of the Iliad.",
    "Paris is the capital of France.",
)
GRADES = (3, 2, 1, 0, 2, 0)
REQUEST = JudgeRequest(query=QUERY, passages=TEXTS, rate_context=True, top_k_count=3)


@pytest.fixture(autouse=True)
def _fresh_process_memory() -> Iterator[None]:
    forget_known_modes()
    yield
    forget_known_modes()


@pytest.fixture
def labelled(fake_llm: FakeLLM) -> FakeLLM:
    fake_llm.set_labels(dict(zip(((QUERY, t) for t in TEXTS), GRADES, strict=True)))
    return fake_llm


def judge_settings(tmp_path: Path, redis_url: str, fake: FakeLLM, **extra: object) -> Settings:
    values: dict[str, object] = {
        "judge_base_url": fake.base_url,
        "judge_model": "fake-judge",
        "judge_max_retries": 0,
        "judge_timeout_seconds": 5,
        "judge_malformed_retries": 1,
    }
    values.update(extra)
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'rm.db'}", redis_url, **values)


def sent_formats(fake: FakeLLM) -> list[str | None]:
    """The response_format type of every call the server saw, in order (None: not sent)."""
    return [(r.get("response_format") or {}).get("type") for r in fake.stats()["requests"]]


def user_passages(request_body: dict[str, Any]) -> list[str]:
    user = request_body["messages"][-1]["content"]
    return [
        json.loads(line.split("] ", 1)[1]) for line in user.split("\n") if line.startswith("[p")
    ]


def test_a_server_without_json_schema_gets_json_mode_and_it_is_remembered(
    tmp_path: Path, redis_url: str, labelled: FakeLLM
) -> None:
    labelled.set_fault("reject_json_schema")  # 400, param response_format, as OpenAI words it
    settings = judge_settings(tmp_path, redis_url, labelled)
    reply = LlmJudge(settings).judge(REQUEST)
    assert reply.grades == GRADES
    assert reply.context_rating == 2
    assert reply.output_modes == {"json_object_schema": 1}
    assert reply.calls == 1  # the rejected call produced nothing and is not a judge call
    assert sent_formats(labelled) == ["json_schema", "json_object"]
    requests = labelled.stats()["requests"]
    assert requests[1]["response_format"]["schema"] == reply_schema(REQUEST)
    store = redis.Redis.from_url(redis_url)
    key = mode_key(settings.judge_base_url, settings.judge_model)
    assert store.get(key) == b"json_object_schema"
    assert 0 < store.ttl(key) <= settings.judge_output_mode_memory_seconds

    # Another worker process: nothing in its own memory, the shared one saves it the rejection.
    forget_known_modes()
    again = make_judge(settings)
    assert again.judge(REQUEST).output_modes == {"json_object_schema": 1}
    assert sent_formats(labelled) == ["json_schema", "json_object", "json_object"]
    assert labelled.stats()["faults_served"] == {"reject_json_schema": 1}


def test_a_server_that_takes_only_bare_json_mode_gets_it(
    tmp_path: Path, redis_url: str, labelled: FakeLLM
) -> None:
    labelled.set_fault("json_object_only")
    settings = judge_settings(tmp_path, redis_url, labelled)
    reply = LlmJudge(settings).judge(REQUEST)
    assert reply.grades == GRADES
    assert reply.output_modes == {"json_object": 1}
    assert [r.get("response_format") for r in labelled.stats()["requests"]][1:] == [
        {"type": "json_object", "schema": reply_schema(REQUEST)},
        {"type": "json_object"},
    ]
    key = mode_key(settings.judge_base_url, settings.judge_model)
    assert redis.Redis.from_url(redis_url).get(key) == b"json_object"


def test_a_server_without_any_structured_output_gets_plain_text(
    tmp_path: Path, redis_url: str, labelled: FakeLLM
) -> None:
    labelled.set_fault(
        "reject_response_format"
    )  # FastAPI-style 422 for json_schema and json_object
    settings = judge_settings(tmp_path, redis_url, labelled)
    reply = LlmJudge(settings).judge(REQUEST)
    assert reply.grades == GRADES
    assert reply.output_modes == {"text": 1}
    assert sent_formats(labelled) == ["json_schema", "json_object", "json_object", None]
    key = mode_key(settings.judge_base_url, settings.judge_model)
    assert redis.Redis.from_url(redis_url).get(key) == b"text"


def test_text_mode_reads_a_fenced_reply_and_json_mode_does_not(
    tmp_path: Path, redis_url: str, labelled: FakeLLM
) -> None:
    labelled.set_fault("fenced_json")
    text = LlmJudge(judge_settings(tmp_path, redis_url, labelled, judge_output_mode="text"))
    reply = text.judge(REQUEST)
    assert reply.grades == GRADES
    assert (reply.calls, reply.malformed_replies, reply.output_modes) == (1, 0, {"text": 1})
    assert sent_formats(labelled) == [None]

    strict = LlmJudge(
        judge_settings(tmp_path, redis_url, labelled, judge_output_mode="json_object")
    )
    spoiled = strict.judge(REQUEST)
    # JSON mode promised bare JSON: a fenced reply is malformed, retried once, then missing.
    assert spoiled.grades == (None,) * len(TEXTS)
    assert spoiled.context_rating is None
    assert (spoiled.calls, spoiled.malformed_replies) == (2, 2)
    assert spoiled.prompt_tokens > 0
    assert spoiled.completion_tokens > 0


def test_a_fixed_mode_never_steps_down(tmp_path: Path, redis_url: str, labelled: FakeLLM) -> None:
    labelled.set_fault("reject_json_schema")
    judge = LlmJudge(judge_settings(tmp_path, redis_url, labelled, judge_output_mode="json_schema"))
    with pytest.raises(TransientJudgeError) as caught:
        judge.judge(REQUEST)
    assert caught.value.reason == "output_mode_rejected"
    assert sent_formats(labelled) == ["json_schema"]
    key = mode_key(labelled.base_url, "fake-judge")
    assert redis.Redis.from_url(redis_url).get(key) is None


def test_a_server_error_is_not_taken_for_a_rejected_mode(
    tmp_path: Path, redis_url: str, labelled: FakeLLM
) -> None:
    labelled.set_fault("http_500")
    with pytest.raises(TransientJudgeError) as caught:
        LlmJudge(judge_settings(tmp_path, redis_url, labelled)).judge(REQUEST)
    assert caught.value.reason == "server_error"
    assert sent_formats(labelled) == ["json_schema"]


def _status_error(status: int, body: object, message: str) -> openai.APIStatusError:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(status, request=request)
    return openai.APIStatusError(message, response=response, body=body)


def test_which_errors_count_as_a_rejected_output_mode() -> None:
    openai_style = {"message": "Invalid parameter", "param": "response_format", "type": "x"}
    assert is_format_rejection(_status_error(400, openai_style, "Invalid parameter"))
    fastapi_style = {"detail": [{"loc": ["body", "response_format", "type"], "msg": "bad"}]}
    assert is_format_rejection(_status_error(422, fastapi_style, "Unprocessable"))
    too_long = {"message": "maximum context length is 8192 tokens", "code": "context_length"}
    assert not is_format_rejection(_status_error(400, too_long, "context length exceeded"))
    assert not is_format_rejection(_status_error(500, openai_style, "response_format crashed"))
    # llama-cpp-python turns its request validation error into a 500 with the error as text.
    llama_style = (
        "1 validation error: {'type': 'literal_error', 'loc': ('body', 'response_format', "
        "'type'), 'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}"
    )
    assert is_format_rejection(_status_error(500, None, llama_style))
    assert not is_format_rejection(_status_error(503, None, llama_style))


def test_per_passage_judging_asks_once_per_passage_and_once_for_the_context(
    tmp_path: Path, redis_url: str, labelled: FakeLLM
) -> None:
    batched = LlmJudge(judge_settings(tmp_path, redis_url, labelled)).judge(REQUEST)
    labelled.reset()
    labelled.set_labels(dict(zip(((QUERY, t) for t in TEXTS), GRADES, strict=True)))
    judge = LlmJudge(judge_settings(tmp_path, redis_url, labelled, judge_per_passage=True))
    assert judge.identity.prompt_version == PROMPT_VERSION + "-per-passage"
    reply = judge.judge(REQUEST)
    requests = labelled.stats()["requests"]
    assert reply.calls == len(TEXTS) + 1
    assert [user_passages(r) for r in requests[: len(TEXTS)]] == [[t] for t in TEXTS]
    assert user_passages(requests[-1]) == list(TEXTS[:3])  # the top k, for the context rating
    # The fake grades by text alone, so the two ways agree exactly: a protocol check, not a
    # measurement of a real judge's agreement.
    assert reply.grades == batched.grades == GRADES
    assert reply.context_rating == batched.context_rating == 2
    assert reply.output_modes == {"json_schema": len(TEXTS) + 1}


def test_shuffled_judging_shows_another_order_and_maps_grades_back(
    tmp_path: Path, redis_url: str, labelled: FakeLLM
) -> None:
    judge = LlmJudge(judge_settings(tmp_path, redis_url, labelled, judge_shuffle=True))
    assert judge.identity.prompt_version == PROMPT_VERSION + "-shuffled"
    reply = judge.judge(REQUEST)
    (sent,) = labelled.stats()["requests"]
    shown = user_passages(sent)
    assert shown != list(TEXTS)
    assert sorted(shown[:3]) == sorted(TEXTS[:3])  # the top k stay the first markers
    assert reply.grades == GRADES
    assert reply.context_rating == 2


def test_the_mode_in_use_is_exported_as_a_metric(
    tmp_path: Path, redis_url: str, labelled: FakeLLM
) -> None:
    labelled.set_fault("reject_json_schema")
    settings = judge_settings(tmp_path, redis_url, labelled)
    runtime, pk = store_event(settings, "ev-mode", QUERY, TEXTS, k=3)
    judge = make_judge(settings, runtime.redis)
    assert judging.judge_event(runtime, judge, pk) == "judged"
    values = runtime.aggregates.read()
    assert values[("judge_output_mode", ("fake-judge", "json_object_schema"), "")] == 1
    assert ("judge_output_mode", ("fake-judge", "json_schema"), "") not in values
    assert values[("judge_calls", ("fake-judge", "ok"), "")] == 1
