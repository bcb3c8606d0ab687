"""What the checks of a caller read of the application's state: the settings (through the
runtime), the API keys, the pages' sessions and the scrape token. A structural type, so the auth
room names no room above it; ``service.http.state.AppState`` is one."""

from __future__ import annotations

from typing import Protocol

from service.auth.keys import KeyStore
from service.auth.sessions import SessionStore
from service.wiring.runtime import Runtime


class AuthParts(Protocol):
    @property
    def runtime(self) -> Runtime: ...

    @property
    def keys(self) -> KeyStore: ...

    @property
    def sessions(self) -> SessionStore: ...

    @property
    def scrape_token(self) -> str | None: ...
