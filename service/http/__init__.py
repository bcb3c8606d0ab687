"""What every HTTP route shares, the API's and the pages': the application's long-lived parts
built once per app (``state``) and the route dependencies declared once as aliases (``deps``).

May import: ``service.primitives``, ``service.config``, ``service.contract``, ``service.queue``,
``service.store``, ``service.telemetry``, ``service.wiring``, ``service.ingest``, ``service.spend``,
``service.analysis`` and ``service.auth``. Never ``service.ui``, ``service.api`` or ``workers``.
"""
