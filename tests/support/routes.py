"""Every route the application answers, read from the application itself."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from service.auth.cross_site import SAFE_METHODS


@dataclass(frozen=True, order=True)
class RouteAddress:
    method: str
    path: str  # with its path parameters, e.g. /v1/events/{event_id}

    def url(self, **values: str) -> str:
        """The path with each ``{name}`` replaced by ``values[name]``."""
        return self.path.format(**values)


def _paths_and_methods(app: FastAPI) -> Iterator[tuple[str, set[str]]]:
    for route in app.routes:
        # An included router is one entry of app.routes; its routes, with their prefixes, come
        # from effective_route_contexts().
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            for context in contexts():
                original: Any = context.original_route
                yield context.path, set(getattr(original, "methods", None) or ())
        else:
            yield getattr(route, "path", ""), set(getattr(route, "methods", None) or ())


def every_route(app: FastAPI) -> list[RouteAddress]:
    return sorted(
        RouteAddress(method, path)
        for path, methods in _paths_and_methods(app)
        for method in methods
    )


def state_changing_routes(app: FastAPI) -> list[RouteAddress]:
    """Every route of a method that may change something: all but GET, HEAD and OPTIONS."""
    return [route for route in every_route(app) if route.method not in SAFE_METHODS]


def body_models(app: FastAPI) -> dict[RouteAddress, type[BaseModel]]:
    """The JSON body model of every route that declares one."""
    models: dict[RouteAddress, type[BaseModel]] = {}
    for route in app.routes:
        contexts = getattr(route, "effective_route_contexts", None)
        for context in contexts() if contexts is not None else ():
            dependant = getattr(context.original_route, "dependant", None)
            for param in getattr(dependant, "body_params", None) or ():
                model = param.field_info.annotation
                if isinstance(model, type) and issubclass(model, BaseModel):
                    for method in getattr(context.original_route, "methods", None) or ():
                        models[RouteAddress(method, context.path)] = model
    return models
