"""The LLM judge: chat-completions calls through the ``openai`` package.

Works with any OpenAI-compatible server (OpenAI, Azure, vLLM, Ollama, llama.cpp,
llama-cpp-python). By default one call grades every passage of an event; with
``judge_per_passage`` each passage gets a call of its own (plus one for the context rating), for
comparison with tools that judge that way. With ``judge_shuffle`` the passages are shown in an
order fixed by the event's content rather than the retriever's, so a judge that favours early
positions does not inflate rank-sensitive measures.

The reply is constrained as far as the server allows (see ``output_mode``). Transport problems
(429 with Retry-After, 5xx, timeouts) are retried with backoff by the client itself; replies that do
not fit the schema get ``judge_malformed_retries`` more calls, after which the labels still missing
stay missing (never 0).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from redis import Redis

from service.config.settings import Settings
from service.store.judging import JudgeIdentity
from workers.judge.base import JudgeReply, PreparedSlice, TransientJudgeError
from workers.judge.output_mode import OutputModes, is_format_rejection
from workers.judge.prompt import (
    JudgeRequest,
    MalformedReplyError,
    OutputMode,
    parse_reply,
    presentation_order,
    prompt_version,
    reordered,
    response_format,
    system_message,
    user_message,
)

log = logging.getLogger(__name__)


@dataclass
class _Tally:
    """What the calls of one ``judge`` cost, added up across its sub-requests and retries."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    malformed: int = 0
    modes: Counter[str] = field(default_factory=Counter)


class LlmJudge:
    def __init__(self, settings: Settings, redis: Redis | None = None) -> None:
        self.settings = settings
        # Calls wait on the server, not on this process: several can be in flight at once.
        self.max_concurrency = settings.judge_concurrency
        self.per_passage = settings.judge_per_passage
        self.shuffle = settings.judge_shuffle and not settings.judge_per_passage
        self.identity = JudgeIdentity(
            judge=settings.judge_model,
            model=settings.judge_model,
            prompt_version=prompt_version(per_passage=self.per_passage, shuffle=self.shuffle),
        )
        if redis is None and settings.redis_url:
            redis = Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
        self.modes = OutputModes(
            settings.judge_output_mode,
            settings.judge_base_url,
            settings.judge_model,
            redis=redis,
            memory_seconds=settings.judge_output_mode_memory_seconds,
        )
        self.client = openai.OpenAI(
            base_url=settings.judge_base_url,
            # Local servers need no key, but the client insists on one.
            api_key=settings.judge_api_key.get_secret_value() or "unused",
            timeout=settings.judge_timeout_seconds,
            max_retries=settings.judge_max_retries,
        )

    def prepare(self, requests: Sequence[JudgeRequest]) -> PreparedSlice:
        """Nothing to share between the calls of a slice: each is a request of its own."""
        return PreparedSlice(self)

    def judge(self, request: JudgeRequest) -> JudgeReply:
        started = time.perf_counter()
        tally = _Tally()
        if self.per_passage:
            grades, context = self._judge_one_by_one(request, tally)
        elif self.shuffle:
            order = presentation_order(request)
            shown, context = self._ask(reordered(request, order), tally)
            unshuffled: list[int | None] = [None] * len(order)
            for position, index in enumerate(order):
                unshuffled[index] = shown[position]
            grades = tuple(unshuffled)
        else:
            grades, context = self._ask(request, tally)
        return JudgeReply(
            grades=grades,
            context_rating=context,
            calls=tally.calls,
            prompt_tokens=tally.prompt_tokens,
            completion_tokens=tally.completion_tokens,
            malformed_replies=tally.malformed,
            latency_seconds=time.perf_counter() - started,
            output_modes=dict(tally.modes),
        )

    def _judge_one_by_one(
        self, request: JudgeRequest, tally: _Tally
    ) -> tuple[tuple[int | None, ...], int | None]:
        grades: list[int | None] = []
        for text in request.passages:
            alone = JudgeRequest(
                query=request.query, passages=(text,), rate_context=False, top_k_count=0
            )
            grades.extend(self._ask(alone, tally)[0])
        context: int | None = None
        if request.rate_context and request.top_k_count:
            # The context rating is of the top-k together, so it needs them in one call; the
            # grades that call also gives are not per-passage grades and are dropped.
            top_k = JudgeRequest(
                query=request.query,
                passages=request.passages[: request.top_k_count],
                rate_context=True,
                top_k_count=request.top_k_count,
            )
            context = self._ask(top_k, tally, need_grades=False)[1]
        return tuple(grades), context

    def _ask(
        self, request: JudgeRequest, tally: _Tally, *, need_grades: bool = True
    ) -> tuple[tuple[int | None, ...], int | None]:
        """One question, asked again while the reply is malformed or incomplete."""
        grades: list[int | None] = [None] * len(request.passages)
        context: int | None = None
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system_message(request)},
            {"role": "user", "content": user_message(request)},
        ]
        for _attempt in range(1 + self.settings.judge_malformed_retries):
            completion, mode = self._complete(request, messages, tally)
            choice = completion.choices[0] if completion.choices else None
            try:
                if choice is None:
                    raise MalformedReplyError("no choices in the reply")
                if choice.finish_reason == "length":
                    raise MalformedReplyError("reply cut off at the token limit")
                if getattr(choice.message, "refusal", None):
                    raise MalformedReplyError("the model refused")
                parsed = parse_reply(choice.message.content, request, mode)
            except MalformedReplyError as exc:
                tally.malformed += 1
                log.warning("malformed judge reply: %s", exc, extra={"mode": mode})
                continue
            # Keep what earlier attempts already gave; fill only the gaps.
            grades = [
                old if old is not None else new
                for old, new in zip(grades, parsed.grades, strict=True)
            ]
            if context is None:
                context = parsed.context_rating
            grades_done = not need_grades or all(g is not None for g in grades)
            context_done = context is not None or not request.rate_context
            if (need_grades and parsed.missing) or (
                request.rate_context and parsed.context_rating is None
            ):
                tally.malformed += 1
            if grades_done and context_done:
                break
        return tuple(grades), context

    def _complete(
        self,
        request: JudgeRequest,
        messages: list[ChatCompletionMessageParam],
        tally: _Tally,
    ) -> tuple[ChatCompletion, OutputMode]:
        """One answered call, stepping down the output mode while the server rejects it."""
        mode = self.modes.current()
        while True:
            body: dict[str, object] = {
                "model": self.settings.judge_model,
                "messages": messages,
                "temperature": 0,
                "max_tokens": self.settings.judge_max_tokens,
            }
            fmt = response_format(request, mode)
            if fmt is not None:
                body["response_format"] = fmt
            try:
                # The client's own request path (retries, timeouts, errors, auth) without its
                # typed ``create``: that walks the body against the parameter types on every call,
                # over a third of the client's CPU per call, for a body that is already plain
                # JSON.
                completion = self.client.post(
                    "/chat/completions", body=body, cast_to=ChatCompletion
                )
            except openai.RateLimitError as exc:
                raise TransientJudgeError("rate_limited", str(exc)) from exc
            except openai.APITimeoutError as exc:
                raise TransientJudgeError("timeout", str(exc)) from exc
            except openai.APIConnectionError as exc:
                raise TransientJudgeError("connection", str(exc)) from exc
            except openai.APIStatusError as exc:
                if is_format_rejection(exc):
                    lower = self.modes.step_down(mode)
                    if lower is not None:
                        mode = lower
                        continue
                    raise TransientJudgeError("output_mode_rejected", str(exc)) from exc
                reason = "server_error" if exc.status_code >= 500 else "client_error"
                raise TransientJudgeError(reason, str(exc)) from exc
            tally.calls += 1
            tally.modes[mode] += 1
            if completion.usage is not None:
                tally.prompt_tokens += completion.usage.prompt_tokens
                tally.completion_tokens += completion.usage.completion_tokens
            return completion, mode
