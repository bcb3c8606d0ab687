"""The database: engine and sessions, the tables, the migrations, and every query.

One repository module per aggregate: ``events`` (an event, its passages and feedback),
``judging`` (judgments, judge runs, the label cache, scores), ``keys``, ``spend``,
``analysis`` (a window's events for the analysis) and ``calibration`` (the local judge's
similarities on gold traffic, the thresholds applied to it); ``lookups`` holds the many-keys
probe two of them share, ``dialect`` the small dialect-aware SQL helpers (the one
insert-or-update and insert-or-ignore of each dialect among them) and ``pages`` the web pages'
reads (and the miss causes they record). Routes and tasks call these; none writes SQL itself.

May import: ``service.primitives``, ``service.config``, ``service.contract`` and
``service.measures``. Nothing downstream.
"""
