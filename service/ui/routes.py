"""Every route of the UI in one router: the pages and the miss-cause API."""

from __future__ import annotations

from fastapi import APIRouter

from service.ui import api, label_page, pages

router = APIRouter()
router.include_router(pages.router)
router.include_router(api.router)
router.include_router(label_page.router)
