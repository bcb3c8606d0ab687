"""Every request served inside its application's redactor and limits, so that every body it
validates has its lists counted before their items are read
(``service/contract/count_limits.py``) and its free text masked
(``service/contract/client_text.py``), whichever route takes it."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.config.settings import Settings
from service.contract.client_text import redacting
from service.contract.count_limits import counting
from service.contract.redaction import Redactor


class RequestScopeMiddleware:
    def __init__(self, app: ASGIApp, redactor: Redactor, settings: Settings) -> None:
        self.app = app
        self.redactor = redactor
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with redacting(self.redactor), counting(self.settings):
            await self.app(scope, receive, send)
