"""The LLM judge: one chat-completions call per event through the ``openai`` package.

Works with any OpenAI-compatible server (OpenAI, Azure, vLLM, Ollama, llama.cpp). Transport
problems (429 with Retry-After, 5xx, timeouts) are retried with backoff by the client itself;
replies that do not fit the schema get ``judge_malformed_retries`` more calls, after which the
labels still missing stay missing (never 0).
"""

from __future__ import annotations

import logging
import time
from typing import cast

import openai
from openai.types.chat import ChatCompletionMessageParam
from openai.types.chat.completion_create_params import ResponseFormat

from service.repository import JudgeIdentity
from service.settings import Settings
from workers.judge.base import JudgeReply, TransientJudgeError
from workers.judge.prompt import (
    PROMPT_VERSION,
    JudgeRequest,
    MalformedReplyError,
    parse_reply,
    response_format,
    system_message,
    user_message,
)

log = logging.getLogger(__name__)


class LlmJudge:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.identity = JudgeIdentity(
            judge=settings.judge_model, model=settings.judge_model, prompt_version=PROMPT_VERSION
        )
        self.client = openai.OpenAI(
            base_url=settings.judge_base_url,
            # Local servers need no key, but the client insists on one.
            api_key=settings.judge_api_key.get_secret_value() or "unused",
            timeout=settings.judge_timeout_seconds,
            max_retries=settings.judge_max_retries,
        )

    def judge(self, request: JudgeRequest) -> JudgeReply:
        grades: list[int | None] = [None] * len(request.passages)
        context: int | None = None
        calls = prompt_tokens = completion_tokens = malformed = 0
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system_message(request)},
            {"role": "user", "content": user_message(request)},
        ]
        started = time.perf_counter()
        for _attempt in range(1 + self.settings.judge_malformed_retries):
            calls += 1
            try:
                completion = self.client.chat.completions.create(
                    model=self.settings.judge_model,
                    messages=messages,
                    response_format=cast(ResponseFormat, response_format(request)),
                    temperature=0,
                    max_tokens=self.settings.judge_max_tokens,
                )
            except openai.RateLimitError as exc:
                raise TransientJudgeError("rate_limited", str(exc)) from exc
            except openai.APITimeoutError as exc:
                raise TransientJudgeError("timeout", str(exc)) from exc
            except openai.APIConnectionError as exc:
                raise TransientJudgeError("connection", str(exc)) from exc
            except openai.APIStatusError as exc:
                reason = "server_error" if exc.status_code >= 500 else "client_error"
                raise TransientJudgeError(reason, str(exc)) from exc
            if completion.usage is not None:
                prompt_tokens += completion.usage.prompt_tokens
                completion_tokens += completion.usage.completion_tokens
            choice = completion.choices[0] if completion.choices else None
            try:
                if choice is None:
                    raise MalformedReplyError("no choices in the reply")
                if choice.finish_reason == "length":
                    raise MalformedReplyError("reply cut off at the token limit")
                if getattr(choice.message, "refusal", None):
                    raise MalformedReplyError("the model refused")
                parsed = parse_reply(choice.message.content, request)
            except MalformedReplyError as exc:
                malformed += 1
                log.warning("malformed judge reply: %s", exc)
                continue
            # Keep what earlier attempts already gave; fill only the gaps.
            grades = [
                old if old is not None else new
                for old, new in zip(grades, parsed.grades, strict=True)
            ]
            if context is None:
                context = parsed.context_rating
            if parsed.missing or (request.rate_context and parsed.context_rating is None):
                malformed += 1
                if all(g is not None for g in grades) and (
                    context is not None or not request.rate_context
                ):
                    break
                continue
            break
        return JudgeReply(
            grades=tuple(grades),
            context_rating=context,
            calls=calls,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            malformed_replies=malformed,
            latency_seconds=time.perf_counter() - started,
        )
