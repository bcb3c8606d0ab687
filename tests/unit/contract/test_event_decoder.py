"""The compiled reading of a batch body says yes only where the models say yes, and then builds
exactly what they build: over generated bodies (hostile values in every field, every encoding a
client may use), and over the models' own field lists, so a field added to the contract and not
to the structs makes the decoder decline rather than drop it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from service.config.settings import Settings
from service.contract.count_limits import counting
from service.contract.event_decoder import STRUCT_FIELDS, decode_valid_batch
from service.contract.schemas import BatchIn, CandidateIn, DecodedEvents, EventIn, PassageIn
from service.store.events import payload_hash
from tests.support.hostile_values import BUDGET, PLAIN, events

# Small limits, so that generated lists cross them.
LIMITS = Settings(max_passages=4, max_candidates=2, max_gold_ids=3, max_batch_events=3)


def by_the_models(body: bytes) -> list[EventIn] | None:
    """What the route built before the decoder: json.loads, the batch model, then each event's
    model, inside the request's count limits; None when any of it refuses."""
    try:
        raw = json.loads(body)
        with counting(LIMITS):
            batch = BatchIn.model_validate(raw)
            return [EventIn.model_validate(event) for event in batch.events]
    except (ValueError, ValidationError):  # json.JSONDecodeError is a ValueError
        return None


def typed(value: Any) -> Any:
    """The value with every scalar's type beside it: 1 and 1.0 are equal, but not the same."""
    if isinstance(value, BaseModel):
        return typed(value.model_dump())
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    if isinstance(value, datetime):
        return (datetime, value.isoformat(), value.utcoffset())
    return (type(value), value)


def assert_same_reading(body: bytes) -> list[EventIn] | None:
    decoded = decode_valid_batch(body, LIMITS)
    reference = by_the_models(body)
    if decoded is not None:
        assert reference is not None, "decoded a body the models refuse"
        assert type(decoded) is DecodedEvents
        assert typed(decoded) == typed(reference)
        assert [payload_hash(e) for e in decoded] == [payload_hash(e) for e in reference]
    return reference


EVENT_IDS = st.one_of(
    st.just("ok-1"),
    st.sampled_from(["", "a\n", "a b", "x" * 201, "é", "a:b.c-d_e"]),
)


# Text a store keeps: any code point but NUL and the lone surrogates.
KEPT_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
SOUND_TEXT = KEPT_TEXT.filter(lambda t: t.strip() != "")
OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
SOUND_NUMBER = st.one_of(
    st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False)
)
SOUND_JSON = st.recursive(
    st.one_of(SOUND_NUMBER, st.booleans(), KEPT_TEXT),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(KEPT_TEXT, inner, max_size=3)
    ),
    max_leaves=10,
)


@st.composite
def sound_events(draw: st.DrawFn, number: int) -> dict[str, Any]:
    """An event the models accept, every optional field drawn or left out: what a client
    that reads the contract sends, in all its forms."""
    count = draw(st.integers(1, 4))
    items: list[dict[str, Any]] = []
    for index in range(count):
        item: dict[str, Any] = {"text": draw(SOUND_TEXT.map(lambda t: t[:50]))}
        if draw(st.booleans()):
            item["id"] = f"d{index}"
        if draw(st.booleans()):
            item["score"] = draw(SOUND_NUMBER)
        items.append(item)
    event: dict[str, Any] = {
        "app": draw(SOUND_TEXT.map(lambda t: t[:100])),
        "retriever": draw(SOUND_TEXT.map(lambda t: t[:100])),
        "query": draw(SOUND_TEXT),
        "passages": items,
    }
    optional: dict[str, st.SearchStrategy[Any]] = {
        "event_id": st.one_of(st.none(), st.just(f"s-{number}")),
        "timestamp": st.datetimes(
            min_value=datetime(1971, 1, 1), max_value=datetime(2199, 1, 1), timezones=OFFSETS
        ).map(datetime.isoformat),
        "environment": st.one_of(st.none(), KEPT_TEXT.map(lambda t: t[:100])),
        "k": st.integers(1, count),
        "candidates": st.lists(
            st.fixed_dictionaries({"id": PLAIN}, optional={"score": SOUND_NUMBER}), max_size=2
        ),
        "gold_passage_ids": st.lists(PLAIN, min_size=1, max_size=3),
        "response": st.one_of(st.none(), KEPT_TEXT),
        "response_grade": st.one_of(st.none(), st.integers(1, 5)),
        "answer_correct": st.one_of(st.none(), st.booleans()),
        "metadata": st.one_of(st.none(), st.dictionaries(KEPT_TEXT, SOUND_JSON, max_size=3)),
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        event[name] = draw(optional[name])
    return event


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(1, 4))
    # Mostly sound events, so that whole batches are valid and their builds compared; one in
    # four hostile, so that a bad event among good ones is met too.
    batch = [
        draw(events(i) if draw(st.integers(0, 3)) == 0 else sound_events(i)) for i in range(count)
    ]
    for event in batch:
        if draw(st.integers(0, 9)) == 0:
            event["event_id"] = draw(EVENT_IDS)
        if draw(st.integers(0, 19)) == 0:
            event[draw(PLAIN)] = 1  # a field the contract does not have
    text = json.dumps({"events": batch}, ensure_ascii=draw(st.booleans()))
    # surrogatepass: a lone surrogate sent as raw bytes, which json.loads takes back.
    return text.encode("utf-8", "surrogatepass")


@BUDGET
@given(bodies())
def test_a_decoded_batch_is_what_the_models_build_and_only_what_they_accept(body: bytes) -> None:
    assert_same_reading(body)


def plain_event(number: int, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event_id": f"e-{number}",
        "app": "shop",
        "retriever": "bm25",
        "query": "where is it?",
        "passages": [{"id": "d1", "text": "one", "score": 2}, {"text": "two", "score": 0.5}],
    }
    event.update(fields)
    return event


VALID = [
    plain_event(1),
    plain_event(2, timestamp="2026-11-30T10:00:00.123456789+02:00", k=1, environment=""),
    plain_event(3, candidates=[{"id": "c", "score": 1}], gold_passage_ids=["d1", "d1", "x"]),
    plain_event(4, response="yes", response_grade=5, answer_correct=False, metadata={"a": [1]}),
    plain_event(5, metadata={"big": 2**63 - 1, "f": 1e308, "n": None, "deep": [[{"k": "v"}]]}),
    plain_event(6, event_id=None, query="é\u2028ü", passages=[{"text": "\U0001f600"}]),
]


@pytest.mark.parametrize("event", VALID, ids=lambda e: str(e["event_id"]))
def test_a_valid_event_is_decoded_not_handed_back(event: dict[str, Any]) -> None:
    body = json.dumps({"events": [event]}).encode()
    assert decode_valid_batch(body, LIMITS) is not None
    assert assert_same_reading(body) is not None


REFUSED_BY_THE_MODELS = [
    plain_event(1, event_id="a\n"),
    plain_event(2, query=" \t"),
    plain_event(3, passages=[{"text": "a\x00b"}]),
    plain_event(4, passages=[{"text": "x", "score": 2**63}]),
    plain_event(5, metadata={"x": 2**64}),
    plain_event(6, timestamp="2026-11-30T10:00:00"),
    plain_event(7, passages=[{"id": "d", "text": "a"}, {"id": "d", "text": "b"}]),
    plain_event(8, k=3),
    plain_event(9, gold_passage_ids=[]),
    plain_event(10, passages=[{"text": "x"}] * 5),
    plain_event(11, extra=1),
]


@pytest.mark.parametrize("event", REFUSED_BY_THE_MODELS, ids=lambda e: str(e["event_id"]))
def test_an_invalid_event_hands_the_whole_batch_back(event: dict[str, Any]) -> None:
    body = json.dumps({"events": [plain_event(0), event]}).encode()
    assert by_the_models(body) is None
    assert decode_valid_batch(body, LIMITS) is None


def test_forms_the_models_coerce_are_handed_back_to_them() -> None:
    # A score sent as text, and a unix time: the models take them, the structs do not guess.
    for event in (
        plain_event(1, passages=[{"text": "x", "score": "1.5"}]),
        plain_event(2, timestamp=1_700_000_000),
    ):
        body = json.dumps({"events": [event]}).encode()
        assert by_the_models(body) is not None
        assert decode_valid_batch(body, LIMITS) is None


def test_more_events_than_the_batch_limit_are_handed_back() -> None:
    body = json.dumps({"events": [plain_event(n) for n in range(4)]}).encode()
    assert decode_valid_batch(body, LIMITS) is None


@pytest.mark.parametrize("model", list(STRUCT_FIELDS), ids=lambda model: model.__name__)
def test_the_structs_read_every_field_of_the_models(model: type[BaseModel]) -> None:
    assert set(STRUCT_FIELDS[model]) == set(model.model_fields)


# An event with every field of every model, each string field given: the strings a body can
# carry, which the NUL test below enumerates.
EVERY_FIELD = plain_event(
    1,
    passages=[{"id": "d1", "text": "one", "score": 1.0}, {"id": "d2", "text": "two"}],
    timestamp="2026-11-30T10:00:00+00:00",
    environment="prod",
    k=2,
    candidates=[{"id": "c1", "score": 0.5}],
    gold_passage_ids=["d1"],
    response="an answer",
    response_grade=4,
    answer_correct=True,
    metadata={"user": "u1", "tags": ["a", {"nested": "b"}]},
)


def _string_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], bool]]:
    """Where ``value`` holds a string: (path, whether it is an object's key) for each."""
    found: list[tuple[tuple[Any, ...], bool]] = []
    if isinstance(value, str):
        found.append((path, False))
    elif isinstance(value, dict):
        for key, item in value.items():
            found.append(((*path, key), True))
            found.extend(_string_paths(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_string_paths(item, (*path, index)))
    return found


def _with_nul(event: dict[str, Any], path: tuple[Any, ...], key: bool) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(event))
    holder: Any = copy
    *parents, last = path
    for step in parents:
        holder = holder[step]
    if key:
        holder[f"{last}\x00"] = holder.pop(last)
    else:
        holder[last] = f"{holder[last][:1]}\x00{holder[last][1:]}"
    return copy


def test_every_field_of_every_model_is_in_the_full_event() -> None:
    # So a field added to the contract is added there too, and its strings get the NUL below.
    passages, candidates = EVERY_FIELD["passages"], EVERY_FIELD["candidates"]
    assert set(EVERY_FIELD) == set(EventIn.model_fields)
    assert set().union(*passages) == set(PassageIn.model_fields)
    assert set().union(*candidates) == set(CandidateIn.model_fields)
    assert decode_valid_batch(json.dumps({"events": [EVERY_FIELD]}).encode(), LIMITS) is not None


@pytest.mark.parametrize(
    ("path", "key"),
    [item for item in _string_paths(EVERY_FIELD) if item[0][0] in EventIn.model_fields],
    ids=lambda item: "/".join(map(str, item)) if isinstance(item, tuple) else str(item),
)
def test_a_nul_in_any_string_of_an_event_hands_the_batch_back(
    path: tuple[Any, ...], key: bool
) -> None:
    # Field names themselves are the contract's; a NUL there is an unknown field, refused too.
    body = json.dumps({"events": [plain_event(0), _with_nul(EVERY_FIELD, path, key)]}).encode()
    assert by_the_models(body) is None
    assert decode_valid_batch(body, LIMITS) is None
