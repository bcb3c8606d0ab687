"""The names of the service's Celery tasks: the API, the sweeper and the replay send them by
name, and the workers register under them, so neither side imports the other's code."""

from __future__ import annotations

JUDGE_TASK = "judge.event"
JUDGE_SLICE_TASK = "judge.events"
FANOUT_TASK = "judge.fanout"
SWEEP_TASK = "events.sweep"
PURGE_TASK = "events.purge"
KEEP_DAYS_TASK = "events.keep_days"
