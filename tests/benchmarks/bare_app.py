"""The ingest baseline: the same body parsed into the same models, answered 202, nothing stored.

Served exactly like the real API (one uvicorn process, no access log), so the ratio of the two
throughputs is the cost of storing, counting and enqueueing. Run:
``python -m tests.benchmarks.bare_app PORT``.
"""

from __future__ import annotations

import sys
from typing import Any

from fastapi import FastAPI, status

from service.contract.schemas import BatchIn, EventIn


def create_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/events", status_code=status.HTTP_202_ACCEPTED)
    def post_event(event: EventIn) -> dict[str, Any]:
        """Parse and drop."""
        return {"event_id": event.event_id, "status": "accepted"}

    @app.post("/v1/events/batch")
    def post_batch(batch: BatchIn) -> dict[str, Any]:
        """Parse every event and drop them."""
        events = [
            raw if isinstance(raw, EventIn) else EventIn.model_validate(raw) for raw in batch.events
        ]
        return {"accepted": len(events)}

    @app.get("/readyz")
    def readyz() -> dict[str, str]:
        """Always ready."""
        return {"status": "ok"}

    return app


def main() -> None:
    import uvicorn

    uvicorn.run(
        create_app(), host="127.0.0.1", port=int(sys.argv[1]), log_config=None, access_log=False
    )


if __name__ == "__main__":
    main()
