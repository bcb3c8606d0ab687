"""The judge queue as seen from outside Celery's workers: the broker's URL and connection, the
queue names, the check that Redis will not drop queued tasks, the token bucket of every rate
limit, the tasks' names (``tasks``) and the judge message on the wire (``messages``). Ingest and
the workers share it, so the workers never import ingest.

May import: ``service.primitives`` and ``service.config``.
"""
