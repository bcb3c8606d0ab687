"""Judge cost control shared by every worker: token and dollar budgets through Redis, and
shedding a backlog the judge cannot keep up with.

May import: ``service.store``, ``service.telemetry`` and the root modules.
"""
