"""Judging stored events again with another judge or prompt version (the ``rejudge`` command).

For backfills and judge comparisons. The new scores carry their own judge and prompt version, so
the old and the new series sit side by side and nothing is overwritten. The run is resumable: its
cursor (the last event sent) lives in Redis under a key derived from its arguments, so the same
command picks up where it stopped; the workers skip events that already have a score from that
judge under their prompt version. It stays within the budgets: before each batch it checks the
apps' budgets and waits for the window to reset (or stops, with ``--no-wait``), and the workers
reserve every call as usual.

After a prompt change, naming the workers' own model (``--judge-model`` set to ``RM_JUDGE_MODEL``)
gives stored events scores under the new prompt version beside their old ones.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime

from celery import Celery
from tqdm import tqdm

from service.primitives.keys import redis_key, structured_key
from service.queue.tasks import JUDGE_TASK
from service.spend.budget import Budget
from service.store import spend as spend_repository
from service.store.engine import session_scope
from service.wiring.runtime import Runtime

CURSOR_NAMESPACE = "rm:rejudge"
CURSOR_TTL_SECONDS = 30 * 86400


@dataclass(frozen=True)
class RejudgePlan:
    since: datetime
    until: datetime
    tenant: str
    app: str | None
    retriever: str | None
    overrides: dict[str, str]
    include_skipped: bool = False
    # The window as the user wrote it ("7d"): the same command resolves it to other instants
    # later, and must still find its cursor.
    window_text: str = ""

    @property
    def run_id(self) -> str:
        fields = asdict(self)
        del fields["since"], fields["until"]
        return hashlib.sha256(structured_key(fields).encode()).hexdigest()[:16]

    @property
    def target_judge(self) -> str | None:
        """The judge name the new scores will carry, when only the model changes (a prompt
        change keeps the judge name, and its scores are told apart by version alone)."""
        if set(self.overrides) - {"judge_model", "judge_base_url"}:
            return None
        return self.overrides.get("judge_model")

    def judge_to_leave_out(self, workers_model: str) -> str | None:
        """The judge whose scored events need not be sent: the target judge, unless it is the
        model the workers already judge with.

        Re-judging with the workers' own model is how stored events get scores under a new
        prompt version; their earlier scores from that model carry the old version, which only
        the workers know to tell apart (``service`` does not import the prompt), so they must
        be sent, and the workers skip what their current version has already scored.
        """
        target = self.target_judge
        return None if target == workers_model else target


def cursor_key(plan: RejudgePlan) -> str:
    """Where a run keeps how far it got, so the same command resumes it."""
    return redis_key(CURSOR_NAMESPACE, plan.run_id)


@dataclass(frozen=True)
class RejudgeResult:
    total: int  # events of the selection still to send when the run started
    sent: int
    stopped_for_budget: str | None  # the app whose budget stopped a --no-wait run
    narrow: int = 0  # events of the window stored without texts (RM_KEEP_TEXTS): not sendable


def seconds_until_reset(window: str, now: float) -> float:
    period = 3600 if window.endswith("hour") else 86400
    return period - now % period


class Rejudge:
    def __init__(
        self,
        runtime: Runtime,
        sender: Celery,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.runtime = runtime
        self.sender = sender
        self.sleep = sleep
        self.budget = Budget(runtime.redis, runtime.settings)

    def cursor_key(self, plan: RejudgePlan) -> str:
        return cursor_key(plan)

    def cursor(self, plan: RejudgePlan) -> int:
        value = self.runtime.redis.get(self.cursor_key(plan))
        return int(value) if value is not None else 0

    def run(
        self,
        plan: RejudgePlan,
        batch_size: int = 200,
        max_queued: int = 1_000,
        wait_for_budget: bool = True,
        limit: int | None = None,
        progress: bool = True,
    ) -> RejudgeResult:
        queue = self.runtime.settings.queue_name
        selection = spend_repository.RejudgeSelection(
            since=plan.since,
            until=plan.until,
            tenant=plan.tenant,
            app=plan.app,
            retriever=plan.retriever,
            include_skipped=plan.include_skipped,
            after_pk=self.cursor(plan),
            without_judge=plan.judge_to_leave_out(self.runtime.settings.judge_model),
        )
        with session_scope(self.runtime.engine) as session:
            todo = spend_repository.rejudge_candidates(session, selection)
            narrow = spend_repository.narrow_events(session, selection)
        if limit is not None:
            todo = todo[:limit]
        sent = 0
        bar = tqdm(total=len(todo), unit="event", disable=not progress, file=sys.stderr)
        try:
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                apps = {app for _, app in batch}
                blocked = self._wait_for_budget(plan.tenant, apps, wait_for_budget, bar)
                if blocked is not None:
                    return RejudgeResult(len(todo), sent, blocked, narrow)
                while self.runtime.broker_queues.depths([queue])[queue] > max_queued:
                    self.sleep(1.0)
                with self.sender.producer_or_acquire() as producer:
                    for pk, _ in batch:
                        self.sender.send_task(
                            JUDGE_TASK, args=[pk, plan.overrides], queue=queue, producer=producer
                        )
                self.runtime.redis.set(self.cursor_key(plan), batch[-1][0], ex=CURSOR_TTL_SECONDS)
                sent += len(batch)
                bar.update(len(batch))
        finally:
            bar.close()
        return RejudgeResult(len(todo), sent, None, narrow)

    def _wait_for_budget(
        self,
        tenant: str,
        apps: set[str],
        wait: bool,
        bar: tqdm,  # type: ignore[type-arg]
    ) -> str | None:
        """Block until every app of the batch has budget left (the tenant's own budgets); the app
        that stops a no-wait run."""
        for app in sorted(apps):
            while True:
                remaining = self.budget.remaining(tenant, app)
                spent = [w for w, left in remaining.items() if left == 0]
                if not spent:
                    break
                if not wait:
                    return app
                pause = max(seconds_until_reset(w, time.time()) for w in spent)
                bar.set_postfix_str(f"budget of {app} spent, waiting {pause:.0f}s")
                self.sleep(min(pause + 1, 60.0))
            bar.set_postfix_str("")
        return None
