"""A batch of events decoded from its bytes in one compiled pass, when every event is valid.

The models of ``schemas`` are the contract: what they accept, and the message of every refusal.
Building them from a parsed body costs a batched event about twice what the parse does (the
JSON parse into Python objects, the walk that checks every value can be stored, then pydantic
over the same objects). This module is a second reading of the same contract, made only to be
fast: msgspec decodes the body straight into typed structs, counting and typing as it goes, and
the few rules the structs cannot state are checked on them after.

It only ever says yes or "ask the models": ``decode_valid_batch`` returns the events exactly as
``EventIn.model_validate`` would have built them from ``json.loads`` of the same bytes, or None
when anything at all is off (one malformed event, a list over its limit, a text no store can
keep, a form the structs are stricter about than the models, such as a number sent as a
string). Then the caller reads the body the usual way, and the models say what is wrong. So a
refusal is always the models' own, and an accepted event is the one they would have accepted:
``tests/unit/contract/test_event_decoder.py`` holds the two readings equal over generated bodies,
and the fields of these structs to the models' fields.
"""

from __future__ import annotations

import re
from datetime import datetime
from operator import attrgetter
from typing import Annotated, Any, TypeVar

import msgspec
from pydantic import BaseModel, TypeAdapter, ValidationError

from service.config.settings import Settings
from service.contract.schemas import (
    MAX_ID_CHARS,
    MAX_LABEL_COLUMN_CHARS,
    BatchIn,
    CandidateIn,
    DecodedEvents,
    EventIn,
    PassageIn,
)
from service.contract.storable import NotStorableError, check_body, check_moment

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
_Label = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LABEL_COLUMN_CHARS)]
_Environment = Annotated[str, msgspec.Meta(max_length=MAX_LABEL_COLUMN_CHARS)]
# The models' pattern, matched whole here: ``$`` of Python's re also matches before a final
# newline, which the models' (Rust) regex does not.
_EVENT_ID = re.compile(r"[A-Za-z0-9._:\-]+")
_DATETIME = TypeAdapter(datetime)
_INT64 = 2**63
# What no store can keep in a text: msgspec refuses every lone surrogate (escaped or as raw
# bytes) and every raw control character, which leaves the NUL, sent as ``\u0000``. Each decoded
# string is looked at for it (a memchr over a text already in memory); a search for the escape
# over the body's bytes cost more than the whole decode.
_NUL = "\x00"
_Model = TypeVar("_Model", bound=BaseModel)
_set = object.__setattr__  # a model refuses attributes set the usual way


# A score is read as int or float: the models refuse an integer outside 64 bits (it cannot be
# stored), which a float field would already have rounded into range.
class _Passage(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    id: _Id | None = None
    score: int | float | None = None


class _Candidate(msgspec.Struct, forbid_unknown_fields=True):
    id: _Id
    score: int | float | None = None


class _Event(msgspec.Struct, forbid_unknown_fields=True):
    app: _Label
    retriever: _Label
    query: str
    passages: list[_Passage]
    event_id: str | None = None
    # Read as text and parsed by the models' own datetime parser, so every form is theirs.
    timestamp: str | None = None
    environment: _Environment | None = None
    k: int | None = None
    candidates: list[_Candidate] | None = None
    gold_passage_ids: list[_Id] | None = None
    response: str | None = None
    response_grade: Annotated[int, msgspec.Meta(ge=1, le=5)] | None = None
    answer_correct: bool | None = None
    metadata: dict[str, Any] | None = None


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    events: list[_Event]


# The event's own text fields; the passages', candidates' and gold ids' are looked at where
# they are read, the metadata's by ``check_body``. A test sends a NUL in every string the
# structs hold, so a text field added here without its look makes it fail.
_event_texts = attrgetter(
    "event_id", "app", "retriever", "query", "timestamp", "environment", "response"
)


# Every field the models have, by name: the structs read exactly these (a test holds it).
STRUCT_FIELDS: dict[type[BaseModel], tuple[str, ...]] = {
    BatchIn: _Batch.__struct_fields__,
    EventIn: _Event.__struct_fields__,
    PassageIn: _Passage.__struct_fields__,
    CandidateIn: _Candidate.__struct_fields__,
}

_DECODER = msgspec.json.Decoder(_Batch)


class _ForTheModelsError(Exception):
    """Something the models must look at themselves."""


def decode_valid_batch(body: bytes, settings: Settings) -> DecodedEvents | None:
    """Every event of a ``{"events": [...]}`` body, built as the models build them, or None
    when the body is not a batch of valid events within the count limits of ``settings``."""
    try:
        batch = _DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if len(batch.events) > settings.max_batch_events:
        return None
    try:
        return DecodedEvents(_event(event, settings) for event in batch.events)
    except (_ForTheModelsError, NotStorableError, ValidationError):
        return None


def _score(value: float | None) -> float | None:
    if type(value) is int:
        if not -_INT64 <= value < _INT64:
            raise _ForTheModelsError
        return float(value)
    return value


def _built(model: type[_Model], values: dict[str, Any]) -> _Model:
    """The model holding ``values``, already valid, as ``model_construct`` builds it but
    without its per-field defaults pass, which cost more than the decode (every field given)."""
    built = object.__new__(model)
    _set(built, "__dict__", values)
    _set(built, "__pydantic_fields_set__", set(values))
    _set(built, "__pydantic_extra__", None)
    _set(built, "__pydantic_private__", None)
    return built


def _event(raw: _Event, settings: Settings) -> EventIn:
    passages = raw.passages
    if not passages or len(passages) > settings.max_passages:
        raise _ForTheModelsError
    if raw.k is not None and not 1 <= raw.k <= len(passages):
        raise _ForTheModelsError
    if raw.event_id is not None and (
        len(raw.event_id) > MAX_ID_CHARS or _EVENT_ID.fullmatch(raw.event_id) is None
    ):
        raise _ForTheModelsError
    if not raw.query.strip():
        raise _ForTheModelsError
    if any(value is not None and _NUL in value for value in _event_texts(raw)):
        raise _ForTheModelsError
    built: list[PassageIn] = []
    ids: set[str] = set()
    for passage in passages:
        text = passage.text
        if not text or text.isspace() or _NUL in text:
            raise _ForTheModelsError
        if passage.id is not None:
            if passage.id in ids or _NUL in passage.id:
                raise _ForTheModelsError
            ids.add(passage.id)
        built.append(
            _built(PassageIn, {"id": passage.id, "text": text, "score": _score(passage.score)})
        )
    candidates = None
    if raw.candidates is not None:
        if len(raw.candidates) > settings.max_candidates:
            raise _ForTheModelsError
        if any(_NUL in c.id for c in raw.candidates):
            raise _ForTheModelsError
        candidates = [
            _built(CandidateIn, {"id": c.id, "score": _score(c.score)}) for c in raw.candidates
        ]
    gold = raw.gold_passage_ids
    if gold is not None:
        if not gold or len(gold) > settings.max_gold_ids or any(_NUL in g for g in gold):
            raise _ForTheModelsError
        gold = list(dict.fromkeys(gold))
    timestamp = None
    if raw.timestamp is not None:
        timestamp = check_moment(_DATETIME.validate_python(raw.timestamp), "timestamp")
    if raw.metadata is not None:
        # The walk the models make over the whole body (integers within 64 bits, finite
        # numbers, nesting); the event's own fields are bounded above.
        check_body(raw.metadata, "metadata", 1)
    return _built(
        EventIn,
        {
            "event_id": raw.event_id,
            "timestamp": timestamp,
            "app": raw.app,
            "retriever": raw.retriever,
            "environment": raw.environment,
            "query": raw.query,
            "passages": built,
            "k": raw.k,
            "candidates": candidates,
            "gold_passage_ids": gold,
            "response": raw.response,
            "response_grade": raw.response_grade,
            "answer_correct": raw.answer_correct,
            "metadata": raw.metadata,
        },
    )
