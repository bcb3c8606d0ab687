"""Judge cost control shared by every worker: token and dollar budgets through Redis, and
shedding a backlog the judge cannot keep up with.

May import: ``service.primitives``, ``service.config``, ``service.store``, ``service.telemetry`` and
``service.wiring``.
"""
