"""Accepting events: everything between a parsed request body and the commit of its events.

``accept`` is the entry (limits, redaction, triage, commit, counters, judge dispatch); beside it
``signals`` and ``sampling`` (what is decided per event without a judge), ``backpressure`` and
``ratelimit`` (what refuses work), ``group_commit`` (single events sharing one transaction),
``counts`` (the counters of one call), ``dispatch`` (judge messages gathered into slices),
``deferred`` (the near-duplicate ratio, counted after the answer) and ``redaction``. ``otlp`` is
one more source of events: OTLP/HTTP spans in, event dicts out.

May import: ``service.kernel``, ``service.store``, ``service.telemetry``, ``service.measures`` and
``service.wiring``. Never ``service.api``, ``service.ui`` or ``workers``.
"""
