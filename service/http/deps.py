"""Every route dependency, declared once as an alias that routes take as a parameter type.

A route states what it needs by its parameters' types (``state: StateDep, caller: Caller``); how
each is obtained lives here and nowhere else, so a change to it (a key check, a cache) reaches
every route at once. ``tests/unit/test_layers.py`` holds every other module of ``service`` to that.
The checks themselves are the auth room's; here each is given the application's state.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.auth.browser import page_principal, ui_principal
from service.auth.callers import caller_principal, operations_access
from service.auth.keys import Principal
from service.http.state import AppState, app_state


async def request_state(request: Request) -> AppState:
    """``app_state`` as a route dependency. FastAPI runs a sync dependency in the thread pool;
    that hop costs far more than this attribute read, and every ingest request paid it."""
    return app_state(request)


async def api_caller(request: Request) -> Principal:
    # Async, like ``request_state``: with no key required the caller is known without a hop.
    return await caller_principal(request, app_state(request))


# The three below are sync on purpose: a key or session lookup may query the database or Redis,
# so FastAPI runs them in the thread pool.
def ui_caller(request: Request) -> Principal:
    return ui_principal(request, app_state(request))


def page_caller(request: Request) -> Principal:
    return page_principal(request, app_state(request))


def operations_check(request: Request) -> None:
    operations_access(request, app_state(request))


# The application's long-lived parts: settings, database, Redis, ingest, metrics, keys.
StateDep = Annotated[AppState, Depends(request_state)]
# The tenant of an API call, from its key (``default`` when no key is required).
Caller = Annotated[Principal, Depends(api_caller)]
# The tenant of a call the pages make: a key in a header, or the pages' login cookie.
UiCaller = Annotated[Principal, Depends(ui_caller)]
# The tenant of a page; without a usable key the browser is sent to the login form.
PageCaller = Annotated[Principal, Depends(page_caller)]
# A check that gives the route nothing: listed in ``dependencies=[...]`` of ``/metrics``.
OPERATIONS_ACCESS = Depends(operations_check)
