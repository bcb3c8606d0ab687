"""Judge spend budgets per tenant and app, per hour and per UTC day, in tokens and in dollars,
shared by every worker through Redis.

A budget belongs to a (tenant, app) pair, never to an app name alone: tenants choose their app
names freely, so another tenant sending under the same name must not spend this one's budget.

What a call costs is known only after it returns (the reply's usage), so a worker first reserves
an estimate and settles the difference afterwards. The reservation checks and spends in one Lua
script: a call is admitted only while the window still has budget left, and the admission itself
is spent before any other worker can look. All workers together therefore overshoot a window by at
most the one reservation that crossed the line (the estimate is an upper bound: the prompt's
size plus the completion limit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis import Redis

from service.config.settings import Settings
from service.primitives.keys import composite_key, composite_parts, redis_key
from service.store.models import DEFAULT_TENANT
from service.telemetry.aggregates import Delta
from service.telemetry.cardinality import LabelSetCap
from service.telemetry.metrics import BUDGET_REMAINING
from service.wiring.runtime import Runtime

WINDOWS = ("tokens_per_hour", "tokens_per_day", "dollars_per_hour", "dollars_per_day")
_SECONDS = {"hour": 3600, "day": 86400}

# KEYS: the four window counters, then the day's set of spenders. ARGV: four limits (0: none),
# four amounts, four TTLs, then the pair's member in that set. Returns 0 when admitted (all four
# spent, the pair added to the day's spenders), else the 1-based index of the first exhausted
# window.
_RESERVE = """
for i = 1, 4 do
  local limit = tonumber(ARGV[i])
  if limit > 0 and (tonumber(redis.call('GET', KEYS[i])) or 0) >= limit then
    return i
  end
end
for i = 1, 4 do
  redis.call('INCRBYFLOAT', KEYS[i], ARGV[4 + i])
  redis.call('EXPIRE', KEYS[i], ARGV[8 + i])
end
redis.call('SADD', KEYS[5], ARGV[13])
redis.call('EXPIRE', KEYS[5], ARGV[12])
return 0
"""


@dataclass(frozen=True)
class Price:
    prompt_per_1k: float = 0.0
    completion_per_1k: float = 0.0

    def dollars(self, prompt_tokens: float, completion_tokens: float) -> float:
        return (
            prompt_tokens * self.prompt_per_1k + completion_tokens * self.completion_per_1k
        ) / 1000


@dataclass(frozen=True)
class Limits:
    tokens_per_hour: float = 0.0
    tokens_per_day: float = 0.0
    dollars_per_hour: float = 0.0
    dollars_per_day: float = 0.0

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (
            self.tokens_per_hour,
            self.tokens_per_day,
            self.dollars_per_hour,
            self.dollars_per_day,
        )

    @property
    def unlimited(self) -> bool:
        return not any(self.as_tuple())


def overrides_for(tenant: str, app: str, settings: Settings) -> dict[str, float]:
    """The overridden windows of a tenant's app: ``budget_tenant_overrides[tenant][app]`` over
    ``budget_overrides[app]``, the per-app form, which sets the limits of that app name in every
    tenant (each tenant still spends its own budget under them)."""
    chosen: dict[str, float] = dict(settings.budget_overrides.get(app, {}))
    chosen.update(settings.budget_tenant_overrides.get(tenant, {}).get(app, {}))
    return chosen


def limits_for(tenant: str, app: str, settings: Settings) -> Limits:
    base = {
        "tokens_per_hour": settings.budget_tokens_per_hour,
        "tokens_per_day": settings.budget_tokens_per_day,
        "dollars_per_hour": settings.budget_dollars_per_hour,
        "dollars_per_day": settings.budget_dollars_per_day,
    }
    base.update({k: float(v) for k, v in overrides_for(tenant, app, settings).items() if k in base})
    return Limits(**base)


def price_for(model: str, prices: Mapping[str, Mapping[str, float]]) -> Price:
    entry = prices.get(model, {})
    return Price(entry.get("prompt_per_1k", 0.0), entry.get("completion_per_1k", 0.0))


def estimate_prompt_tokens(texts: list[str], overhead: int) -> int:
    # About four characters a token for English under the common BPE vocabularies; the
    # reservation is settled against the reply's usage, so only the order of magnitude matters.
    return overhead + math.ceil(sum(len(t) for t in texts) / 4)


@dataclass(frozen=True)
class Reservation:
    keys: tuple[str, str, str, str]
    tokens: float
    dollars: float
    price: Price


@dataclass(frozen=True)
class Refusal:
    window: str  # one of WINDOWS
    retry_after_seconds: float  # until that window resets


# Tenant and app names are free text: a window counter's key is a ``redis_key``, whose parts are
# percent-encoded (":" too), so a key parses back into its pair.
NAMESPACE = "rm:spend"
# The (tenant, app) pairs that reserved spend on a UTC day, one set per day, each member the pair's
# ``composite_key``: what the budget gauges report, read in one command. Finding them by scanning
# for the day's counters read the whole keyspace at every scrape, which grows with the events
# (their once-only export markers): 0.3 s a scrape at 300,000 events.
SPENDERS_NAMESPACE = "rm:spenders"


def spenders_key(day: int) -> str:
    """The set of the pairs that spent on UTC day ``day`` (days since the epoch)."""
    return redis_key(SPENDERS_NAMESPACE, f"d{day}")


def window_keys(tenant: str, app: str, now: float) -> tuple[str, str, str, str]:
    """The counters of a (tenant, app) pair at ``now``: tokens and dollars, hour and day."""
    hour, day = int(now // 3600), int(now // 86400)
    return (
        redis_key(NAMESPACE, tenant, app, "tokens", f"h{hour}"),
        redis_key(NAMESPACE, tenant, app, "tokens", f"d{day}"),
        redis_key(NAMESPACE, tenant, app, "dollars", f"h{hour}"),
        redis_key(NAMESPACE, tenant, app, "dollars", f"d{day}"),
    )


class Budget:
    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self._reserve = redis.register_script(_RESERVE)

    def keys(self, tenant: str, app: str, now: float) -> tuple[str, str, str, str]:
        return window_keys(tenant, app, now)

    def reserve(
        self,
        tenant: str,
        app: str,
        model: str,
        prompt_tokens: float,
        completion_tokens: float,
        now: float | None = None,
    ) -> Reservation | Refusal:
        """Spend an upper estimate of a call if the tenant's app has budget left, atomically."""
        now = time.time() if now is None else now
        price = price_for(model, self.settings.judge_prices)
        tokens = prompt_tokens + completion_tokens
        dollars = price.dollars(prompt_tokens, completion_tokens)
        keys = self.keys(tenant, app, now)
        limits = limits_for(tenant, app, self.settings).as_tuple()
        # A day key outlives its day by an hour so a late settle still finds it.
        ttls = (2 * 3600, 86400 + 3600, 2 * 3600, 86400 + 3600)
        verdict = int(
            self._reserve(
                keys=[*keys, spenders_key(int(now // 86400))],
                args=[*limits, tokens, tokens, dollars, dollars, *ttls, composite_key(tenant, app)],
            )
        )
        if verdict:
            window = WINDOWS[verdict - 1]
            period = _SECONDS[window.rsplit("_", 1)[1]]
            return Refusal(window, period - now % period)
        return Reservation(keys, tokens, dollars, price)

    def settle(
        self, reservation: Reservation, prompt_tokens: float, completion_tokens: float
    ) -> None:
        """Replace the reserved estimate by what the call really cost (from the reply's usage)."""
        tokens = prompt_tokens + completion_tokens - reservation.tokens
        dollars = reservation.price.dollars(prompt_tokens, completion_tokens) - reservation.dollars
        pipe = self.redis.pipeline(transaction=True)
        for key, amount in zip(reservation.keys, (tokens, tokens, dollars, dollars), strict=True):
            pipe.incrbyfloat(key, amount)
        pipe.execute()

    def spent(self, tenant: str, app: str, now: float | None = None) -> dict[str, float]:
        now = time.time() if now is None else now
        values = self.redis.mget(self.keys(tenant, app, now))
        return {w: float(v or 0.0) for w, v in zip(WINDOWS, values, strict=True)}

    def remaining(self, tenant: str, app: str, now: float | None = None) -> dict[str, float | None]:
        """What is left of each window (None: that window has no cap)."""
        spent = self.spent(tenant, app, now)
        limits = limits_for(tenant, app, self.settings).as_tuple()
        return {
            w: (max(limit - spent[w], 0.0) if limit > 0 else None)
            for w, limit in zip(WINDOWS, limits, strict=True)
        }


def spend_delta(
    tenant: str,
    app: str,
    judge: str,
    price: Price,
    calls: int,
    prompt_tokens: int,
    completion_tokens: int,
) -> Delta:
    """The spend figures of one judged event, per tenant and app (apply once per event and
    judge)."""
    delta = Delta(tenant)
    delta.inc("judge_app_calls", {"app": app, "judge": judge}, calls)
    delta.inc("judge_app_tokens", {"app": app, "judge": judge, "kind": "prompt"}, prompt_tokens)
    delta.inc(
        "judge_app_tokens", {"app": app, "judge": judge, "kind": "completion"}, completion_tokens
    )
    delta.inc(
        "judge_cost_dollars",
        {"app": app, "judge": judge},
        price.dollars(prompt_tokens, completion_tokens),
    )
    return delta


class BudgetExhaustedError(Exception):
    """The judge budget of a tenant's app is spent for now; ``refusal`` says which window and
    until when."""

    def __init__(self, tenant: str, app: str, refusal: Refusal) -> None:
        super().__init__(f"judge budget of {app!r} (tenant {tenant!r}) spent ({refusal.window})")
        self.tenant = tenant
        self.app = app
        self.refusal = refusal


def reserve_call(
    runtime: Runtime, tenant: str, app: str, model: str, texts: list[str]
) -> Reservation | None:
    """Reserve one judge call's upper estimate; None when the tenant's app has no cap (nothing
    to hold).

    Raises BudgetExhaustedError when a window of that budget is spent.
    """
    settings = runtime.settings
    if limits_for(tenant, app, settings).unlimited:
        return None
    prompt = estimate_prompt_tokens(texts, settings.judge_prompt_token_overhead)
    held = Budget(runtime.redis, settings).reserve(
        tenant, app, model, prompt, settings.judge_max_tokens
    )
    if isinstance(held, Refusal):
        raise BudgetExhaustedError(tenant, app, held)
    return held


def settle_call(
    runtime: Runtime,
    held: Reservation | None,
    tenant: str,
    app: str,
    judge: str,
    model: str,
    calls: int,
    prompt_tokens: int,
    completion_tokens: int,
) -> Delta:
    """Charge what the call really used to the budget; returns the per-app spend figures, which
    the caller applies to the aggregates together with the rest of its increments."""
    if held is not None:
        Budget(runtime.redis, runtime.settings).settle(held, prompt_tokens, completion_tokens)
    price = price_for(model, runtime.settings.judge_prices)
    return spend_delta(tenant, app, judge, price, calls, prompt_tokens, completion_tokens)


def configured_owners(settings: Settings) -> set[tuple[str, str]]:
    """(tenant, app) pairs that an override names."""
    owners = {(DEFAULT_TENANT, app) for app in settings.budget_overrides}
    owners |= {
        (tenant, app) for tenant, apps in settings.budget_tenant_overrides.items() for app in apps
    }
    return owners


def budgeted_apps(redis: Redis, settings: Settings, now: float) -> set[tuple[str, str]]:
    """(tenant, app) pairs with a budget to report: those with an override, and those that spent
    today (the day's spenders set, one command whatever else Redis holds)."""
    owners = configured_owners(settings)
    for member in redis.smembers(spenders_key(int(now // 86400))):
        parts = composite_parts(member.decode() if isinstance(member, bytes) else str(member))
        if len(parts) == 2:
            owners.add((parts[0], parts[1]))
    return owners


class BudgetGauges(Collector):
    """The budget left per tenant, app and window, read from Redis at scrape time.

    Bounded like every other series: a pair is reported when an override names it or when the
    label-set cap admitted the app for that tenant, so a tenant spending under a thousand app
    names adds no more series than its admitted ones (their budgets still hold)."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.budget = Budget(redis, settings)
        self.cap = LabelSetCap(redis, settings.max_label_sets_per_tenant, settings.max_label_sets)

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        now = time.time()
        gauge = self._family()
        settings = self.budget.settings
        overridden = configured_owners(settings)
        spending = sorted(budgeted_apps(self.budget.redis, settings, now) - overridden)
        admitted = self.cap.admitted_apps(spending)
        shown = overridden | {o for o, ok in zip(spending, admitted, strict=True) if ok}
        for tenant, app in sorted(shown):
            for window, left in self.budget.remaining(tenant, app, now).items():
                if left is not None:
                    gauge.add_metric([tenant, app, window], left)
        return [gauge]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            BUDGET_REMAINING.full_name, BUDGET_REMAINING.help, labels=list(BUDGET_REMAINING.labels)
        )
