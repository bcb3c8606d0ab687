"""Who is calling, in one place: API keys (made, stored as digests, looked up with a short cache),
the pages' login sessions, the scrape token of ``/metrics``, the gate that answers an unknown
caller from the headers before any body is read (``gate``), the caller of an API route or of
``/metrics`` (``callers``), the reader of the pages with their cookie (``browser``), and who is
labelling (``labellers``). What these checks read of the application's state is named
structurally (``parts``), so this room names nothing above it.

May import: ``service.primitives``, ``service.config``, ``service.contract``, ``service.queue``,
``service.store``, ``service.wiring`` and ``service.ingest`` (the OTLP status body of a refusal).
Never ``service.http``, ``service.ui``, ``service.api`` or ``workers``.
"""
