"""Whether ``serve`` may listen where it is configured to: beyond loopback only with API keys
required, or when the deployment says the network in front controls who gets in."""

from __future__ import annotations

import ipaddress

from service.config.settings import Settings


def open_remote_refusal(settings: Settings) -> str | None:
    """Why ``serve`` must not start as configured, or None: listening beyond loopback with no
    API keys required opens ingest and every tenant's pages to whoever reaches the port."""
    if settings.auth_required or settings.allow_open_remote or is_loopback(settings.host):
        return None
    return (
        f"refusing to listen on {settings.host} with API keys off: anyone who reaches the port "
        "could send events and read every page. Set RM_AUTH_REQUIRED=true and create keys "
        "(retrieval-monitor keys create), or set RM_ALLOW_OPEN_REMOTE=true if the network in "
        "front already controls who gets in."
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything
