"""What Prometheus reads: the metric families, the shared aggregates in Redis, the text
exposition of ``/metrics``, what one scored event exports, and the rebuild from the database.

May import: ``service.store``, ``service.measures`` and the root modules (settings, runtime).
Never ``service.ingest``, ``service.api``, ``service.ui`` or ``workers``.
"""
