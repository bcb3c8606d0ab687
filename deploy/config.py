"""The one place for selectors, windows and thresholds of every rule: ``deploy/alerting.yaml``.

Each alert reads its numbers from its own block; the rule expressions in ``deploy.rules`` hold none.
Unknown keys are errors, so a typo in the file cannot silently fall back to a default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from service.measures.catalogue import BY_NAME, MEASURE_NAMES

CONFIG_PATH = Path(__file__).resolve().parent / "alerting.yaml"

_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    """Seconds in a Prometheus duration such as ``30m``, ``1h30m`` or ``500ms``."""
    if not _DURATION.match(duration):
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _SECONDS[unit] for n, unit in _PART.findall(duration))


def _duration(value: str) -> str:
    seconds(value)
    return value


Duration = Annotated[str, AfterValidator(_duration)]
Severity = Literal["critical", "warning", "info"]
Fraction = Annotated[float, Field(gt=0, lt=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class AlertSettings(Strict):
    for_: Duration = Field(alias="for")
    severity: Severity


class Windows(Strict):
    short: Duration
    long: Duration


class QualityCollapse(AlertSettings):
    measure: str
    baseline_offset: Duration
    min_ratio_to_baseline: Fraction
    min_events: int = Field(ge=1)

    @model_validator(mode="after")
    def _known_measure(self) -> QualityCollapse:
        if self.measure not in BY_NAME:
            raise ValueError(f"unknown measure {self.measure!r}; one of {sorted(MEASURE_NAMES)}")
        if BY_NAME[self.measure].signed:
            raise ValueError(
                f"{self.measure} can be negative: a ratio to its baseline means nothing"
            )
        return self


class JudgingStalled(AlertSettings):
    window: Duration


class MetricsAbsent(AlertSettings):
    pass


class BacklogAge(AlertSettings):
    max_age: Duration


class QueueGrowing(AlertSettings):
    window: Duration
    min_depth: int = Field(ge=0)


class JudgeErrors(AlertSettings):
    max_ratio: Fraction
    min_attempts: int = Field(ge=1)


class JudgeSpend(AlertSettings):
    budget_tokens_per_hour: int = Field(gt=0)


class IngestRejections(AlertSettings):
    max_ratio: Fraction
    min_events: int = Field(ge=1)


class IngestServerErrors(AlertSettings):
    max_ratio: Fraction
    min_responses: int = Field(ge=1)
    routes: str


class JudgeDrift(AlertSettings):
    min_kappa: float = Field(ge=-1, le=1)
    max_drop: float = Field(gt=0, le=2)
    baseline_offset: Duration
    min_gold_passages: int = Field(ge=1)


class RetrieverScoreShift(AlertSettings):
    baseline_offset: Duration
    max_relative_change: float = Field(gt=0)
    min_events: int = Field(ge=1)


class EmptyRetrievals(AlertSettings):
    max_ratio: Fraction
    min_factor_over_baseline: float = Field(ge=1)
    baseline_offset: Duration
    min_events: int = Field(ge=1)


class LabelSetsOverflow(AlertSettings):
    pass


class Alerts(Strict):
    quality_collapse: QualityCollapse
    judging_stalled: JudgingStalled
    metrics_absent: MetricsAbsent
    backlog_age: BacklogAge
    queue_growing: QueueGrowing
    judge_errors: JudgeErrors
    judge_spend: JudgeSpend
    ingest_rejections: IngestRejections
    ingest_server_errors: IngestServerErrors
    judge_drift: JudgeDrift
    retriever_score_shift: RetrieverScoreShift
    empty_retrievals: EmptyRetrievals
    label_sets_overflow: LabelSetsOverflow


class MonitoringConfig(Strict):
    selector: str
    replica_labels: tuple[str, ...] = Field(min_length=1)
    runbook_url: str
    windows: Windows
    alerts: Alerts


def load(path: Path = CONFIG_PATH, overrides: dict[str, Any] | None = None) -> MonitoringConfig:
    """The configuration in ``path``, with ``overrides`` merged in key by key (nested dicts)."""
    raw = yaml.safe_load(path.read_text())
    if overrides:
        raw = _merge(raw, overrides)
    return MonitoringConfig.model_validate(raw)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged
