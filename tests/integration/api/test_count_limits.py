"""Every list a request body may carry is counted before its items are validated, and a 422 names
at most a few errors: read from the application's own routes and models, so a list added to any
body later is covered without a new case here.

Switched off, each fails: without ``CountedBody``'s check a list one over its limit answers one
error per item (none of type too_many_items); without the cap in ``validation_errors`` every
error of a body is listed.

Tests ``service.contract.count_limits``, ``service.contract.validation_errors`` and
``service.http.request_scope``.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from annotated_types import MaxLen
from fastapi.testclient import TestClient
from pydantic import BaseModel

from service.config.settings import Settings
from service.contract.count_limits import TOO_MANY_ITEMS, CountLimit
from service.contract.validation_errors import MAX_REPORTED_ERRORS
from tests.support.helpers import make_event
from tests.support.routes import RouteAddress, body_models


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
    for argument in typing.get_args(annotation):
        found += _models_in(argument)
    return found


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_list(argument) for argument in typing.get_args(annotation))
    return False


def list_fields(model: type[BaseModel], seen: set[type] | None = None) -> list[tuple[str, Any]]:
    """(model.field, metadata) of every list field of ``model`` and of the models inside it."""
    seen = seen if seen is not None else set()
    if model in seen:
        return []
    seen.add(model)
    found: list[tuple[str, Any]] = []
    for name, field in model.model_fields.items():
        if _is_list(field.annotation):
            found.append((f"{model.__name__}.{name}", field.metadata))
        for inner in _models_in(field.annotation):
            found += list_fields(inner, seen)
    return found


def test_every_list_of_every_body_has_a_count_limit(client: TestClient) -> None:
    models = body_models(client.app)  # type: ignore[arg-type]
    assert {route.path for route in models} >= {"/v1/events", "/v1/events/batch"}
    unbounded = [
        where
        for model in set(models.values())
        for where, metadata in list_fields(model)
        if not any(isinstance(item, CountLimit | MaxLen) for item in metadata)
    ]
    assert not unbounded, f"lists without a count limit: {unbounded}"


def test_a_list_one_over_its_limit_is_refused_before_its_items_are_read(
    client: TestClient, settings: Settings
) -> None:
    counted: dict[RouteAddress, list[str]] = {}
    for route, model in body_models(client.app).items():  # type: ignore[arg-type]
        limits = getattr(model, "count_limits", {})
        for field, limit in limits.items():
            most = getattr(settings, limit.setting)
            body: dict[str, list[object]] = {field: [{}] * (most + 1)}
            answer = client.request(route.method, route.url(event_id="e1"), json=body)
            assert answer.status_code == 422, (route, field, answer.text)
            errors = answer.json()["errors"]
            assert [error["type"] for error in errors] == [TOO_MANY_ITEMS], (route, field)
            assert f"{limit.setting} {most}" in answer.json()["detail"]
            counted.setdefault(route, []).append(field)
    assert set(counted[RouteAddress("POST", "/v1/events")]) >= {"passages", "gold_passage_ids"}
    assert counted[RouteAddress("POST", "/v1/events/batch")] == ["events"]


def test_a_body_of_many_errors_names_a_few_and_counts_the_rest(client: TestClient) -> None:
    event = make_event("many-errors")
    event["passages"] = [{}] * 150  # within max_passages: every item is read, and wrong
    answer = client.post("/v1/events", json=event)
    assert answer.status_code == 422
    assert len(answer.json()["errors"]) == MAX_REPORTED_ERRORS
    assert answer.json()["detail"].endswith(f"and {150 - MAX_REPORTED_ERRORS} more errors")

    batch = client.post("/v1/events/batch", json={"events": [event]})
    (result,) = batch.json()["results"]
    assert result["status"] == "rejected"
    assert result["error"].endswith(f"and {150 - MAX_REPORTED_ERRORS} more errors")
