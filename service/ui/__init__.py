"""The built-in web pages for reading what went wrong, and the miss-cause API they use.

``router`` carries both: the pages under /ui and the JSON routes under /v1. ``queries`` holds the
pages' database reads (and the miss-cause writes), ``filters`` reads the query string, ``views``
shapes rows for the templates, ``render`` and ``charts`` draw them.

May import: ``service.store``, ``service.measures``, ``service.telemetry`` and the API's shared
dependencies (``service.api.deps``, ``service.api.auth``).
"""

from __future__ import annotations

from fastapi import APIRouter

from service.ui import api, pages

router = APIRouter()
router.include_router(pages.router)
router.include_router(api.router)

__all__ = ["router"]
