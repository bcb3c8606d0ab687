"""Retriever and reranker spans become events; every other span is ignored.

- OpenInference ``RETRIEVER`` spans: the query is ``input.value``, the passages are
  ``retrieval.documents.*``. A retriever span without documents (LlamaIndex's nested ``_retrieve``
  span, which only repeats its parent) is skipped, never stored empty.
- OpenInference ``RERANKER`` spans: ``reranker.output_documents`` are the passages the prompt
  carries and ``reranker.input_documents`` the candidates, so the first stage is measured too.
- Traceloop task spans whose ``traceloop.entity.name`` matches the configured pattern: the
  documents are the task's JSON output and the query is read from its JSON input.

The event_id is ``otel:<trace id>:<span id>``, so an exporter's retry of the same span is a
duplicate rather than a second event. Passages without an id get the id the event API gives them,
a hash of their text; a repeated id gets ``#2``, ``#3``... so each rank stays its own passage.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from service.config.settings import Settings
from service.contract.storable import EARLIEST, LATEST
from service.contract.validate import Rejection
from service.ingest.otlp.decode import DecodedRequest, Selector, Span
from service.ingest.otlp.documents import (
    Document,
    ids_from_output,
    openinference_documents,
    traceloop_documents,
)
from service.ingest.otlp.rules import as_mapping, resolve_int, resolve_text
from service.primitives.hashing import text_hash
from service.store.events import passage_key

log = logging.getLogger(__name__)

OPENINFERENCE_KIND = "openinference.span.kind"
TRACELOOP_KIND = "traceloop.span.kind"
# The spans worth decoding; the decoder skips all others after a scan of their attribute keys.
SELECT: Selector = {
    OPENINFERENCE_KIND: frozenset({"RETRIEVER", "RERANKER"}),
    TRACELOOP_KIND: frozenset({"TASK"}),
}

# The argument of LlamaIndex's public BaseRetriever.retrieve: its span wraps the ``_retrieve``
# span that reports the same documents, so only the inner one becomes an event.
LLAMA_INDEX_PUBLIC_RETRIEVE_ARGUMENT = "str_or_query_bundle"
# Keys under which instrumentations put the query in a JSON input, in order of preference.
QUERY_KEYS = ("query_str", "query", "input", "question", "qb", "query_bundle", "inputs")
MAX_QUERY_SEARCH_DEPTH = 4
MAX_METADATA_NAME_CHARS = 200


@dataclass(frozen=True)
class MappingConfig:
    app_rules: tuple[str, ...]
    retriever_rules: tuple[str, ...]
    environment_rules: tuple[str, ...]
    k_rules: tuple[str, ...]
    default_app: str
    default_retriever: str
    traceloop_entity: re.Pattern[str]
    id_keys: tuple[str, ...]
    score_keys: tuple[str, ...]
    max_label_chars: int

    @classmethod
    def from_settings(cls, settings: Settings) -> MappingConfig:
        return cls(
            app_rules=settings.otlp_app_rules,
            retriever_rules=settings.otlp_retriever_rules,
            environment_rules=settings.otlp_environment_rules,
            k_rules=settings.otlp_k_rules,
            default_app=settings.otlp_default_app,
            default_retriever=settings.otlp_default_retriever,
            traceloop_entity=re.compile(settings.otlp_traceloop_entity_pattern),
            id_keys=settings.otlp_document_id_keys,
            score_keys=settings.otlp_document_score_keys,
            max_label_chars=settings.max_label_chars,
        )


@dataclass(frozen=True)
class Retrieval:
    """What a span reports, before it is shaped into an event."""

    source: str
    query: str | None
    passages: list[Document]
    candidates: list[Document] | None
    output_ids: list[str | None]


@dataclass
class MappedRequest:
    events: list[dict[str, Any]]
    rejections: list[Rejection]
    ignored: int  # decoded spans that are no retrieval, or one without documents


def event_id_for(span: Span) -> str:
    return f"otel:{span.trace_id}:{span.span_id}"


def map_request(decoded: DecodedRequest, config: MappingConfig) -> MappedRequest:
    """The events of a request, once each: a span sent twice in one request counts once."""
    mapped = MappedRequest([], [], 0)
    seen: set[str] = set()
    for span in decoded.spans:
        try:
            outcome = map_span(span, config)
        except Exception as exc:  # never the whole request: the exporter would retry it forever
            # The type only: a traceback's message can quote attribute text, which is not redacted.
            log.warning("OTLP span %s could not be mapped (%s)", span.span_id, type(exc).__name__)
            message = f"span {span.name[:80]!a}: could not be read ({type(exc).__name__})"
            outcome = Rejection(None, "invalid", message)
        if outcome is None:
            mapped.ignored += 1
        elif isinstance(outcome, Rejection):
            mapped.rejections.append(outcome)
        elif outcome["event_id"] not in seen:
            seen.add(outcome["event_id"])
            mapped.events.append(outcome)
    return mapped


def map_span(span: Span, config: MappingConfig) -> dict[str, Any] | Rejection | None:
    """The event (as the event API takes it) a span stands for; None if it is no retrieval."""
    retrieval = find_retrieval(span, config)
    if retrieval is None:
        return None
    what = f"span {span.name[:80]!a} ({retrieval.source})"
    if len(span.trace_id) != 32 or len(span.span_id) != 16 or not int(span.trace_id or "0", 16):
        return Rejection(None, "invalid", f"{what}: invalid trace or span id")
    event_id = event_id_for(span)
    if retrieval.query is None or not retrieval.query.strip():
        return Rejection(event_id, "invalid", f"{what}: no query text")
    missing = [i for i, doc in enumerate(retrieval.passages) if not (doc.text or "").strip()]
    if missing:
        return Rejection(
            event_id,
            "invalid",
            f"{what}: document {missing[0]} has no text (does the instrumentation hide it?)",
        )

    passage_ids = _unique(
        [
            _document_id(doc, fallback, config)
            for doc, fallback in zip(retrieval.passages, retrieval.output_ids, strict=True)
        ]
    )
    event: dict[str, Any] = {
        "event_id": event_id,
        "app": _label(resolve_text(config.app_rules, span) or config.default_app, config),
        "retriever": _label(
            resolve_text(config.retriever_rules, span) or config.default_retriever, config
        ),
        "environment": _optional_label(resolve_text(config.environment_rules, span), config),
        "query": retrieval.query,
        "passages": [
            {"id": pid, "text": doc.text, "score": _document_score(doc, config)}
            for pid, doc in zip(passage_ids, retrieval.passages, strict=True)
        ],
        "metadata": {
            "otel.trace_id": span.trace_id,
            "otel.span_id": span.span_id,
            "otel.span_name": span.name[:MAX_METADATA_NAME_CHARS],
            "otel.source": retrieval.source,
        },
    }
    start = _timestamp(span.start_time_unix_nano) if span.start_time_unix_nano > 0 else None
    if start is not None:
        event["timestamp"] = start.isoformat()
    k = resolve_int(config.k_rules, span)
    if k is not None and k >= 1:
        event["k"] = min(k, len(retrieval.passages))
    if retrieval.candidates is not None:
        event["candidates"] = _candidates(retrieval.candidates, config)
    return event


def find_retrieval(span: Span, config: MappingConfig) -> Retrieval | None:
    attributes = span.attributes
    kind = attributes.get(OPENINFERENCE_KIND)
    if isinstance(kind, str):
        kind = kind.upper()
        if kind == "RETRIEVER":
            documents = openinference_documents(attributes, "retrieval.documents")
            if not documents:
                return None
            return Retrieval(
                source="openinference",
                query=_openinference_query(attributes),
                passages=documents,
                candidates=None,
                output_ids=_output_ids(attributes, documents),
            )
        if kind == "RERANKER":
            documents = openinference_documents(attributes, "reranker.output_documents")
            if not documents:
                return None
            query = attributes.get("reranker.query")
            return Retrieval(
                source="openinference",
                query=query if isinstance(query, str) else _openinference_query(attributes),
                passages=documents,
                candidates=openinference_documents(attributes, "reranker.input_documents"),
                output_ids=[None] * len(documents),
            )
        return None
    if attributes.get(TRACELOOP_KIND) == "task":
        return _traceloop_retrieval(span, config)
    return None


def _traceloop_retrieval(span: Span, config: MappingConfig) -> Retrieval | None:
    attributes = span.attributes
    entity = attributes.get("traceloop.entity.name")
    if not config.traceloop_entity.search(entity if isinstance(entity, str) else span.name):
        return None
    raw_input = _json_or_text(attributes.get("traceloop.entity.input"))
    if isinstance(raw_input, dict) and LLAMA_INDEX_PUBLIC_RETRIEVE_ARGUMENT in raw_input:
        return None
    documents = traceloop_documents(attributes.get("traceloop.entity.output"))
    if not documents:
        return None
    return Retrieval(
        source="traceloop",
        query=find_query(raw_input),
        passages=documents,
        candidates=None,
        output_ids=[None] * len(documents),
    )


def _openinference_query(attributes: Mapping[str, object]) -> str | None:
    value = attributes.get("input.value")
    if not isinstance(value, str):
        return None
    if attributes.get("input.mime_type") == "application/json":
        return find_query(_json_or_text(value))
    return value


def find_query(value: object, depth: int = 0) -> str | None:
    """The query text in a JSON input: a known key first, else the first string found."""
    if isinstance(value, str):
        return value if value.strip() else None
    if depth >= MAX_QUERY_SEARCH_DEPTH:
        return None
    if isinstance(value, dict):
        preferred = [value[key] for key in QUERY_KEYS if key in value]
        others = [item for key, item in value.items() if key not in QUERY_KEYS]
        for item in (*preferred, *others):
            found = find_query(item, depth + 1)
            if found is not None:
                return found
    if isinstance(value, list):
        for item in value:
            found = find_query(item, depth + 1)
            if found is not None:
                return found
    return None


def _output_ids(attributes: Mapping[str, object], documents: list[Document]) -> list[str | None]:
    if all(doc.id is not None for doc in documents):
        return [None] * len(documents)
    if attributes.get("output.mime_type") != "application/json":
        return [None] * len(documents)
    return ids_from_output(attributes.get("output.value"), documents)


def _document_id(doc: Document, fallback: str | None, config: MappingConfig) -> str:
    if doc.id is not None:
        return doc.id
    if fallback is not None:
        return fallback
    metadata = doc.metadata or {}
    for key in config.id_keys:
        value = metadata.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    return passage_key(None, text_hash(doc.text or ""))


def _document_score(doc: Document, config: MappingConfig) -> float | None:
    # A NaN or infinite score says nothing to compare; the event refuses them, so they map to
    # "no score" rather than costing the span its event.
    if doc.score is not None:
        return doc.score if math.isfinite(doc.score) else None
    metadata = doc.metadata or {}
    for key in config.score_keys:
        value = metadata.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value) if math.isfinite(value) else None
    return None


def _candidates(documents: list[Document], config: MappingConfig) -> list[dict[str, Any]]:
    # A candidate needs an id to be compared with the passages; one without id or text has none.
    usable = [doc for doc in documents if doc.id is not None or (doc.text or "").strip()]
    ids = _unique([_document_id(doc, None, config) for doc in usable])
    return [
        {"id": cid, "score": _document_score(doc, config)}
        for cid, doc in zip(ids, usable, strict=True)
    ]


def _unique(ids: Sequence[str]) -> list[str]:
    # The next suffix to try is kept per id, so n copies of one id cost O(n), not O(n^2).
    used: set[str] = set()
    next_suffix: dict[str, int] = {}
    unique: list[str] = []
    for identifier in ids:
        candidate, count = identifier, next_suffix.get(identifier, 1)
        if count > 1:
            candidate = f"{identifier}#{count}"
        while candidate in used:
            count += 1
            candidate = f"{identifier}#{count}"
        next_suffix[identifier] = count + 1
        used.add(candidate)
        unique.append(candidate)
    return unique


def _label(value: str, config: MappingConfig) -> str:
    # A label longer than the limit is cut rather than rejected: the name comes from telemetry
    # the operator does not control span by span.
    return value[: config.max_label_chars]


def _optional_label(value: str | None, config: MappingConfig) -> str | None:
    return _label(value, config) if value else None


def _timestamp(unix_nano: int) -> datetime | None:
    """The span's start, or None when it is outside what a store keeps (the event then takes
    its arrival time, as when no start is sent)."""
    seconds, nanos = divmod(unix_nano, 1_000_000_000)
    try:
        moment = datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=nanos // 1000)
    except (OverflowError, OSError, ValueError):
        return None
    return moment if EARLIEST <= moment < LATEST else None


def _json_or_text(value: object) -> object:
    if isinstance(value, str):
        decoded = as_mapping(value)
        if decoded is not None:
            return decoded
        if value.lstrip().startswith("["):
            try:
                listed: object = json.loads(value)
            except (ValueError, RecursionError):
                return value
            return listed
    return value
