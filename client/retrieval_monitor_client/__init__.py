"""Send retrieval events to retrieval-monitor without blocking the application.

Depends on ``httpx`` alone, and on nothing of the retrieval-monitor service.
"""

from retrieval_monitor_client.client import AsyncMonitorClient, MonitorClient, Passage
from retrieval_monitor_client.outbox import Stats
from retrieval_monitor_client.sender import RejectionHandler

__all__ = ["AsyncMonitorClient", "MonitorClient", "Passage", "RejectionHandler", "Stats"]
