"""Every request served inside its application's redactor, so that every body it validates has
its free text masked (``service/kernel/client_text.py``), whichever route takes it."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.kernel.client_text import redacting
from service.kernel.redaction import Redactor


class RedactionScopeMiddleware:
    def __init__(self, app: ASGIApp, redactor: Redactor) -> None:
        self.app = app
        self.redactor = redactor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with redacting(self.redactor):
            await self.app(scope, receive, send)
