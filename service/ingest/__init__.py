"""Accepting events: everything between a parsed request body and the commit of its events.

One module per step of an event's way, in the order a request takes them: ``admission`` (the
backlog, the commit time and the tenant's rate may refuse the request), then the contract's
``validate`` and ``redact`` (``service.contract``), ``group_commit`` (single
events sharing one transaction), ``ingestor`` (``triage`` of each event, the commit, then the
counters of ``counts`` and the push to ``judge_queue``, the one place judge messages are built,
gathered and sent) and ``deferred`` (the near-duplicate ratio, counted after the answer). Beside
them ``signals`` and ``sampling`` (what ``triage`` decides per event without a judge) and
``backpressure`` (what admission reads). ``otlp`` is one more source of events: OTLP/HTTP spans
in, event dicts out.

May import: ``service.primitives``, ``service.config``, ``service.contract``, ``service.queue``,
``service.store``, ``service.telemetry``, ``service.measures`` and ``service.wiring``. Never
``service.api``, ``service.ui`` or ``workers``.
"""
