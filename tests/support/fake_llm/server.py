"""An OpenAI-compatible chat-completions server that plays the LLM judge in tests.

It reads the judge's request by its own reading of the wire format (it stands for an outside
server, so it shares no code with the project):

    Query: "<JSON string>"
    ...
    [p1] "<JSON string>"
    [p2] "<JSON string>"

and answers ``{"p1": grade, ..., "context": rating}`` (``context`` only when the system message
asks for it) from labels the tests set over HTTP. Tests also inject faults (malformed replies,
429/500, slowness, truncation, refusal, a server that rejects ``json_schema``, one that takes only a
bare ``{"type": "json_object"}``, one that rejects any ``response_format`` with a FastAPI-style
422, replies fenced in Markdown) and read back what
was asked, what was billed and every prompt-injection weakness seen in the requests.

Control plane::

    POST /_control/labels  {"labels": [{"query": q|null, "passage": p|null, "grade": g}],
                            "default_grade": g, "contexts": [{"query": q|null, "rating": r}]}
    POST /_control/faults  {"mode": m, "count": n|null, "retry_after": s, "delay": s}
    POST /_control/release  (lets every call held by the "held" mode answer)
    POST /_control/reset
    GET  /_stats

Run: ``python -m tests.support.fake_llm.server --port P`` (``--port 0`` picks a free port; the
first line on
stdout tells which). It binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, fields
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Fault modes answered with an OpenAI-style error: status, message, type, code, param.
_ERRORS: dict[str, tuple[int, str, str, str | None, str | None]] = {
    "http_429": (429, "Rate limit reached for requests", "requests", "rate_limit_exceeded", None),
    "http_500": (500, "The server had an error", "server_error", None, None),
    # Plain JSON mode only: json_schema refused, and json_object with any extra key too.
    "json_object_only": (
        400,
        "Unrecognized request argument in response_format; only {'type': 'json_object'} works",
        "invalid_request_error",
        None,
        "response_format",
    ),
    "reject_json_schema": (
        400,
        "response_format 'json_schema' is not supported",
        "invalid_request_error",
        None,
        "response_format",
    ),
}
# A server that knows no structured output at all and validates the request the way FastAPI-based
# servers do: 422 with a "detail" list pointing at the field, not OpenAI's "error" object.
_REJECT_ANY_FORMAT = "reject_response_format"
_SPOILED_REPLIES = frozenset(
    {"malformed_json", "grade_out_of_enum", "missing_grades", "finish_length", "fenced_json"}
)
FAULT_MODES = frozenset(
    {"none", "slow", "held", "refusal", _REJECT_ANY_FORMAT, *_ERRORS, *_SPOILED_REPLIES}
)
KEPT_REQUESTS = 200
KEPT_CALL_TIMES = 100_000
# A passage shorter than this is too likely to occur by chance elsewhere in the prompt.
MIN_LEAK_CHARS = 21

_TOKEN = re.compile(r"\w+|[^\w\s]")
_MARKER_LINE = re.compile(r"^\s*\[(p\d+)\](.*)$")
_CONTEXT_WORD = re.compile(r"\bcontext\b", re.IGNORECASE)
_TOP_K_RANGE = re.compile(r"\bp1\.\.p(\d+)\b")
# Values a lenient parser might coerce into a grade; a strict one must reject each of them.
_OUT_OF_ENUM: tuple[Any, ...] = (7, -1, "2", 2.5, True, None)

LabelKey = tuple[str | None, str | None]


def count_tokens(text: str) -> int:
    """An approximate, deterministic token count: words plus punctuation marks."""
    return len(_TOKEN.findall(text))


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


@dataclass
class JudgeCall:
    """The judge request as this server reads it."""

    query: str
    passages: list[tuple[str, str]]  # (marker, text) in prompt order
    rate_context: bool
    top_k: int
    violations: list[str]


def _decode_json_string(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


def read_call(messages: list[dict[str, Any]]) -> JudgeCall:
    system = "\n".join(message_text(m) for m in messages if m.get("role") == "system")
    users = [message_text(m) for m in messages if m.get("role") == "user"]
    user = users[-1] if users else ""
    violations: list[str] = []
    query: str | None = None
    decoded_lines: dict[int, str] = {}  # line index -> its decoded JSON string
    passages: list[tuple[str, str]] = []
    own_lines: list[int] = []  # each passage's line, -1 when it did not decode
    # Split as the strictest reader does (str.splitlines also breaks on U+2028, NEL, vertical
    # tab...): a passage that survives this cannot forge a line for any reader.
    lines = user.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Query: ") and query is None:
            raw = line.removeprefix("Query: ")
            query = _decode_json_string(raw)
            if query is None:
                violations.append(f"query line does not decode as a JSON string: {line[:80]!r}")
                query = raw
            else:
                decoded_lines[index] = query
            continue
        match = _MARKER_LINE.match(line)
        if match is None:
            continue
        name, rest = match.groups()
        text = _decode_json_string(rest[1:]) if rest.startswith(" ") else None
        if text is None or line != line.lstrip():
            violations.append(f"marker line does not decode as a JSON string: {line[:80]!r}")
            # Grade what a model would see, so the call still gets an answer.
            passages.append((name, rest.strip().strip('"')))
            own_lines.append(-1)
            continue
        passages.append((name, text))
        own_lines.append(index)
        decoded_lines[index] = text
    names = [name for name, _ in passages]
    if names != [f"p{i}" for i in range(1, len(names) + 1)]:
        violations.append(f"passage markers are not p1..pN in order: {names}")
    violations.extend(_leaks(lines, decoded_lines, passages, own_lines))
    top_k = _TOP_K_RANGE.search(system)
    return JudgeCall(
        query=query or "",
        passages=passages,
        rate_context=bool(_CONTEXT_WORD.search(system)),
        top_k=int(top_k.group(1)) if top_k else len(passages),
        violations=violations,
    )


def _leaks(
    lines: list[str],
    decoded_lines: dict[int, str],
    passages: list[tuple[str, str]],
    own_lines: list[int],
) -> list[str]:
    """Passage text that shows up raw outside its own line: it escaped its JSON string."""
    found = []
    for (name, text), own in zip(passages, own_lines, strict=True):
        if own < 0 or len(text) < MIN_LEAK_CHARS:
            continue
        # The query or another passage quoting this one is legitimate: its line still encodes it.
        elsewhere = "\n".join(
            line
            for i, line in enumerate(lines)
            if i != own and text not in decoded_lines.get(i, "")
        )
        if text in elsewhere:
            found.append(f"text of {name} appears outside its own line")
    return found


@dataclass
class Fault:
    mode: str = "none"
    remaining: int | None = None  # None: every call
    retry_after: float = 1.0
    delay: float = 1.0


@dataclass
class State:
    """Everything the tests set and read; one lock because handler threads run concurrently."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    labels: dict[LabelKey, int] = field(default_factory=dict)
    default_grade: int = 0
    contexts: dict[str | None, int] = field(default_factory=dict)
    fault: Fault = field(default_factory=Fault)
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: deque[Any] = field(default_factory=lambda: deque(maxlen=KEPT_REQUESTS))
    # When each call arrived (epoch seconds), and when each answered 429 did: the clock of the
    # server, so rate limits and Retry-After waits are checked from the side that bears them.
    call_times: deque[float] = field(default_factory=lambda: deque(maxlen=KEPT_CALL_TIMES))
    rate_limited_times: list[float] = field(default_factory=list)
    faults_served: Counter[str] = field(default_factory=Counter)
    violations: list[dict[str, Any]] = field(default_factory=list)
    # Calls in the "held" mode wait for this (at most their fault's delay) before answering.
    gate: threading.Event = field(default_factory=threading.Event)

    def reset(self) -> None:
        fresh = State()
        self.gate.set()  # no call stays held by a reset server
        with self.lock:
            for item in fields(self):
                if item.name != "lock":
                    setattr(self, item.name, getattr(fresh, item.name))

    def grade(self, query: str, passage: str) -> int:
        for key in ((query, passage), (None, passage), (query, None)):
            if key in self.labels:
                return self.labels[key]
        return self.default_grade

    def context_rating(self, query: str, top_grades: list[int]) -> int:
        for key in (query, None):
            if key in self.contexts:
                return self.contexts[key]
        return 2 if any(g >= 2 for g in top_grades) else 1 if any(g >= 1 for g in top_grades) else 0

    def take_fault(self, body: dict[str, Any]) -> Fault | None:
        fault = self.fault
        if fault.mode == "none":
            return None
        format_type = (body.get("response_format") or {}).get("type")
        if fault.mode == "reject_json_schema" and format_type != "json_schema":
            return None
        if fault.mode == _REJECT_ANY_FORMAT and format_type not in ("json_schema", "json_object"):
            return None
        if fault.mode == "json_object_only" and body.get("response_format") in (
            None,
            {"type": "json_object"},
            {"type": "text"},
        ):
            return None
        if fault.remaining is not None:
            fault.remaining -= 1
            if fault.remaining <= 0:
                self.fault = Fault()
        self.faults_served[fault.mode] += 1
        return fault

    def stats(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "requests": list(self.requests),
            "faults_served": dict(self.faults_served),
            "violations": list(self.violations),
            "call_times": list(self.call_times),
            "rate_limited_times": list(self.rate_limited_times),
        }


def grades_reply(state: State, call: JudgeCall) -> dict[str, Any]:
    grades = {name: state.grade(call.query, text) for name, text in call.passages}
    reply: dict[str, Any] = dict(grades)
    if call.rate_context:
        top = [grades[name] for name, _ in call.passages[: call.top_k]]
        reply["context"] = state.context_rating(call.query, top)
    return reply


def faulty_content(mode: str, reply: dict[str, Any]) -> str:
    """The reply content as a given fault mode spoils it."""
    if mode == "malformed_json":
        return "Here are the grades: " + json.dumps(reply)[:-1] + ","
    if mode == "grade_out_of_enum":
        spoiled = {key: _OUT_OF_ENUM[i % len(_OUT_OF_ENUM)] for i, key in enumerate(reply)}
        return json.dumps(spoiled)
    if mode == "missing_grades":
        markers = [key for key in reply if key != "context"]
        dropped = set(markers[1::2]) | set(markers[-1:])
        return json.dumps({key: value for key, value in reply.items() if key not in dropped})
    if mode == "finish_length":
        text = json.dumps(reply)
        return text[: max(1, len(text) // 2)]
    if mode == "fenced_json":  # what chat models write when nothing constrains them
        return "```json\n" + json.dumps(reply, indent=2) + "\n```"
    return json.dumps(reply)


def validation_error_body(body: dict[str, Any]) -> bytes:
    format_type = (body.get("response_format") or {}).get("type")
    detail = {
        "type": "literal_error",
        "loc": ["body", "response_format", "type"],
        "msg": "Input should be 'text'",
        "input": format_type,
    }
    return json.dumps({"detail": [detail]}).encode()


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> bytes:
    error = {"message": message, "type": kind, "param": param, "code": code}
    return json.dumps({"error": error}).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    # Headers and body go out in two writes; with Nagle on, each keep-alive reply waits ~40 ms.
    disable_nagle_algorithm = True
    server: JudgeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request log per judge call would drown test output

    def do_GET(self) -> None:
        if self.path == "/_stats":
            with self.server.state.lock:
                payload = json.dumps(self.server.state.stats()).encode()
            self._send(HTTPStatus.OK, payload)
        else:
            self._send(HTTPStatus.NOT_FOUND, error_body("not found", "not_found"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            routes = {
                "/v1/chat/completions": self._chat,
                "/_control/labels": self._set_labels,
                "/_control/faults": self._set_fault,
                "/_control/release": self._release,
                "/_control/reset": self._reset,
            }
            route = routes.get(self.path)
            if route is None:
                self._send(HTTPStatus.NOT_FOUND, error_body("not found", "not_found"))
                return
            route(body)
        except (ValueError, TypeError, KeyError) as exc:
            self._send(HTTPStatus.BAD_REQUEST, error_body(str(exc), "invalid_request_error"))

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout in the "slow" mode): nothing to answer

    def _chat(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        call = read_call(messages)
        state = self.server.state
        with state.lock:
            state.calls += 1
            state.call_times.append(time.time())
            number = state.calls
            state.requests.append(body)
            state.violations.extend({"call": number, "detail": v} for v in call.violations)
            fault = state.take_fault(body)
            reply = grades_reply(state, call)
        if fault is not None and fault.mode in _ERRORS:
            status, message, kind, code, param = _ERRORS[fault.mode]
            retry = {"Retry-After": f"{fault.retry_after:g}"} if fault.mode == "http_429" else {}
            if retry:
                with state.lock:
                    state.rate_limited_times.append(time.time())
            self._send(status, error_body(message, kind, code, param), retry)
            return
        if fault is not None and fault.mode == _REJECT_ANY_FORMAT:
            self._send(HTTPStatus.UNPROCESSABLE_ENTITY, validation_error_body(body))
            return
        if fault is not None and fault.mode == "slow":
            time.sleep(fault.delay)
        if fault is not None and fault.mode == "held":
            state.gate.wait(fault.delay)
        mode = fault.mode if fault else "none"
        self._answer(body, messages, number, mode, reply)

    def _answer(
        self,
        body: dict[str, Any],
        messages: list[dict[str, Any]],
        number: int,
        mode: str,
        reply: dict[str, Any],
    ) -> None:
        content: str | None = faulty_content(mode, reply)
        refusal = None
        if mode == "refusal":
            content, refusal = None, "I'm sorry, I can't help with that request."
        prompt_tokens = sum(count_tokens(message_text(m)) for m in messages)
        completion_tokens = count_tokens(content or refusal or "")
        state = self.server.state
        with state.lock:
            state.prompt_tokens += prompt_tokens
            state.completion_tokens += completion_tokens
        message = {"role": "assistant", "content": content, "refusal": refusal}
        completion = {
            "id": f"chatcmpl-fake-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model", "fake-judge")),
            "system_fingerprint": "fake-llm",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "length" if mode == "finish_length" else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        self._send(HTTPStatus.OK, json.dumps(completion).encode())

    def _set_labels(self, body: dict[str, Any]) -> None:
        labels = {
            (entry.get("query"), entry.get("passage")): _grade(entry["grade"], range(4))
            for entry in body.get("labels", [])
        }
        contexts = {
            entry.get("query"): _grade(entry["rating"], range(3))
            for entry in body.get("contexts", [])
        }
        default = _grade(body.get("default_grade", 0), range(4))
        state = self.server.state
        with state.lock:
            state.labels, state.contexts, state.default_grade = labels, contexts, default
        self._send(HTTPStatus.OK, b"{}")

    def _set_fault(self, body: dict[str, Any]) -> None:
        mode = body.get("mode", "none")
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; known: {sorted(FAULT_MODES)}")
        count = body.get("count")
        if count is not None and (not isinstance(count, int) or count < 1):
            raise ValueError("'count' must be a positive integer or null")
        fault = Fault(
            mode=mode,
            remaining=count,
            retry_after=float(body.get("retry_after", 1.0)),
            delay=float(body.get("delay", 1.0)),
        )
        with self.server.state.lock:
            if mode == "held":
                self.server.state.gate.set()  # calls held before are let go, new ones wait
                self.server.state.gate = threading.Event()
            self.server.state.fault = fault
        self._send(HTTPStatus.OK, b"{}")

    def _release(self, body: dict[str, Any]) -> None:
        self.server.state.gate.set()
        self._send(HTTPStatus.OK, b"{}")

    def _reset(self, body: dict[str, Any]) -> None:
        self.server.state.reset()
        self._send(HTTPStatus.OK, b"{}")


def _grade(value: object, allowed: range) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise ValueError(f"grade {value!r} is not in {list(allowed)}")
    return value


class JudgeServer(ThreadingHTTPServer):
    daemon_threads = True  # a handler asleep in the "slow" mode must not block shutdown
    request_queue_size = 128  # many worker processes connect at once; the default backlog is 5

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.state = State()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    server = JudgeServer(args.port)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
