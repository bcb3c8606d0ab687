"""The long-lived parts a process builds once from its settings (database engine, Redis,
redactor, aggregates) and hands to routes and tasks.

May import: ``service.primitives``, ``service.config``, ``service.contract``, ``service.queue``,
``service.store`` and ``service.telemetry``.
"""
