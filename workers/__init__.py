"""The Celery workers: the tasks (``tasks``), the judging of a slice of events (``judging``: what
to ask in ``plan``, the calls in ``calls``, the stored rows and their export in ``record``), the
claims that make one judge call per event, and the judges themselves (``judge``).

May import: ``service.primitives``, ``service.config``, ``service.contract``, ``service.queue``,
``service.store``, ``service.telemetry``, ``service.measures``, ``service.wiring`` and
``service.spend``. The service never imports the workers: it sends them tasks by name.
"""
