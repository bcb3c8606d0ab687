"""What Prometheus reads: the metric families, the shared aggregates in Redis, the text
exposition of ``/metrics``, what a judged event exports, and the rebuild from the database.

May import: ``service.primitives``, ``service.config``, ``service.queue``, ``service.store`` and
``service.measures``; what it needs of a process it names structurally (``parts``). Never
``service.ingest``, ``service.api``, ``service.ui`` or ``workers``.
"""
