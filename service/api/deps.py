"""Every route dependency, declared once as an alias that routes take as a parameter type.

A route states what it needs by its parameters' types (``state: StateDep, caller: Caller``); how
each is obtained lives here and nowhere else, so a change to it (a key check, a cache) reaches
every route at once. ``tests/unit/test_layers.py`` holds every other module of ``service`` to that.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.api.auth import caller_principal, operations_access
from service.api.keys import Principal
from service.api.state import AppState, app_state
from service.ui.auth import page_principal, ui_principal


async def request_state(request: Request) -> AppState:
    """``app_state`` as a route dependency. FastAPI runs a sync dependency in the thread pool;
    that hop costs far more than this attribute read, and every ingest request paid it."""
    return app_state(request)


# The application's long-lived parts: settings, database, Redis, ingest, metrics, keys.
StateDep = Annotated[AppState, Depends(request_state)]
# The tenant of an API call, from its key (``default`` when no key is required).
Caller = Annotated[Principal, Depends(caller_principal)]
# The tenant of a call the pages make: a key in a header, or the pages' login cookie.
UiCaller = Annotated[Principal, Depends(ui_principal)]
# The tenant of a page; without a usable key the browser is sent to the login form.
PageCaller = Annotated[Principal, Depends(page_principal)]
# A check that gives the route nothing: listed in ``dependencies=[...]`` of ``/metrics``.
OPERATIONS_ACCESS = Depends(operations_access)
