"""The database: engine and sessions, the tables, the migrations, and every query.

One repository module per aggregate: ``events`` (an event, its passages and feedback),
``judging`` (judgments, judge runs, the label cache, scores), ``keys``, ``spend``,
``analysis`` (a window's events for the analysis) and ``calibration`` (the local judge's
similarities on gold traffic, the thresholds applied to it); ``lookups`` holds the many-keys
probe two of them share. The web pages' own reads live with the pages (``service.ui.queries``),
since their query parameters are the pages' filters. Routes and tasks call these; none writes
SQL itself.

May import: ``service.kernel`` and ``service.measures``. Nothing downstream.
"""
