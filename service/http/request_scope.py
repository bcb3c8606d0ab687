"""Every request served inside its application's redactor and limits, so that every body it
validates has its lists counted before their items are read
(``service/kernel/count_limits.py``) and its free text masked
(``service/kernel/client_text.py``), whichever route takes it."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.kernel.client_text import redacting
from service.kernel.count_limits import counting
from service.kernel.redaction import Redactor
from service.kernel.settings import Settings


class RequestScopeMiddleware:
    def __init__(self, app: ASGIApp, redactor: Redactor, settings: Settings) -> None:
        self.app = app
        self.redactor = redactor
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with redacting(self.redactor), counting(self.settings):
            await self.app(scope, receive, send)
