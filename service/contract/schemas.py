"""The v1 wire contract: what apps send and what the API answers.

Structural rules (types, required fields) live on the models; the limits that operators tune
(passage count, text lengths) are settings, checked by ``check_limits`` so a change of setting needs
no code change.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from service.config.settings import Settings
from service.contract.client_text import Verbatim, mask_body_in_place
from service.contract.count_limits import CountedBody, CountLimit
from service.contract.storable import check_body, check_moment, check_text, nesting_depth

# Ids are stored in 200-character columns; labels in 100-character ones (the settings that
# lower these bounds cannot raise them).
MAX_ID_CHARS = 200
MAX_LABEL_COLUMN_CHARS = 100
PassageId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]


class StorableBody(CountedBody):
    """A request body whose every key and value, at any depth, a store can keep
    (``service/contract/storable.py``); checked on the raw body before the fields are read, after
    its lists are counted (``service/contract/count_limits.py``).

    Every free text of it is masked once its fields are valid, with the redactor of the request
    being served (``service/contract/client_text.py``): the one gate of a client's text.
    """

    # Set only by a body whose masking must wait for checks made after validation; the module
    # named masks it with ``client_text.mask_model`` and the same redactor.
    masked_later_by: ClassVar[str | None] = None

    @model_validator(mode="before")
    @classmethod
    def every_value_storable(cls, data: Any) -> Any:
        check_body(data)
        return data

    @model_validator(mode="after")
    def free_text_masked(self) -> Any:
        if self.masked_later_by is None:
            mask_body_in_place(self)
        return self


class PassageIn(BaseModel):
    # Scores are stored (candidates in a JSON column): NaN and Infinity are refused up front.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: PassageId | None = Field(None, description="The app's id of the passage.")
    # The schema states "not blank"; the validators say it in words a person can act on.
    text: str = Field(
        description="The passage text as the prompt carried it.",
        json_schema_extra={"minLength": 1, "pattern": r"\S"},
    )
    score: float | None = Field(None, description="The retriever's own score, if any.")

    @field_validator("text")
    @classmethod
    def text_not_blank(cls, value: str) -> str:
        if not value or value.isspace():  # strip() would copy the whole text to tell
            raise ValueError("passage text is empty")
        return check_text(value, "passage text")


class CandidateIn(BaseModel):
    """A first-stage passage when a reranker sits between the retriever and the prompt."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: PassageId
    score: float | None = None


class EventIn(StorableBody):
    """One retrieval as the app saw it: the query and the ranked passages the prompt carried."""

    model_config = ConfigDict(extra="forbid")
    # The limits are measured on the text as sent, so an event is masked after them.
    masked_later_by: ClassVar[str | None] = "service.contract.redact"

    event_id: Annotated[str | None, Verbatim()] = Field(
        None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        pattern=r"^[A-Za-z0-9._:\-]+$",
        description="Client idempotency key; generated when absent.",
    )
    timestamp: datetime | None = Field(None, description="When the retrieval ran (default: now).")
    app: str = Field(
        min_length=1,
        max_length=MAX_LABEL_COLUMN_CHARS,
        description="The application (a metric label).",
    )
    retriever: str = Field(
        min_length=1,
        max_length=MAX_LABEL_COLUMN_CHARS,
        description="Retriever name/version (a metric label).",
    )
    environment: str | None = Field(
        None, max_length=MAX_LABEL_COLUMN_CHARS, description="e.g. prod, staging (a metric label)."
    )
    query: str = Field(
        description="The text the retriever got.",
        json_schema_extra={"minLength": 1, "pattern": r"\S"},
    )
    passages: Annotated[list[PassageIn], CountLimit("max_passages", "passages")] = Field(
        description="Ranked passages; order is rank.", json_schema_extra={"minItems": 1}
    )
    # Strict: JSON true is not 1, nor "3" three.
    k: StrictInt | None = Field(
        None,
        ge=1,
        description="How many passages the prompt carries (default: all). Passages after k "
        "(up to 2k) only estimate the number of relevant passages.",
    )
    candidates: Annotated[list[CandidateIn] | None, CountLimit("max_candidates", "candidates")] = (
        Field(None, description="The first-stage list when a reranker sits before the prompt.")
    )
    gold_passage_ids: Annotated[
        list[PassageId] | None, CountLimit("max_gold_ids", "gold_passage_ids")
    ] = Field(
        None,
        description="Hand-marked passage ids that answer the query (gold traffic): at least "
        "one; a repeated id counts once. Leave the field out when no passage is marked.",
        json_schema_extra={"minItems": 1},
    )
    response: str | None = Field(None, description="The answer the model wrote.")
    response_grade: StrictInt | None = Field(None, ge=1, le=5, description="Answer quality 1-5.")
    answer_correct: bool | None = None
    metadata: dict[str, Any] | None = Field(None, description="Small, never a metric label.")

    @field_validator("timestamp")
    @classmethod
    def timestamp_storable(cls, value: datetime | None) -> datetime | None:
        return None if value is None else check_moment(value, "timestamp")

    @field_validator("query")
    @classmethod
    def query_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is empty")
        return value

    @field_validator("gold_passage_ids")
    @classmethod
    def gold_ids_given(cls, value: list[str] | None) -> list[str] | None:
        # An empty list would make a gold event with N_p = 0: recall undefined, F and nDCG
        # meaningless. No gold passage is said by leaving the field out.
        if value is not None and not value:
            raise ValueError(
                "gold_passage_ids is empty: list at least one gold passage id, or leave the "
                "field out when the query has none marked"
            )
        return None if value is None else list(dict.fromkeys(value))

    @field_validator("passages")
    @classmethod
    def passages_not_empty(cls, value: list[PassageIn]) -> list[PassageIn]:
        if not value:
            raise ValueError("an event needs at least one passage")
        return value

    @model_validator(mode="after")
    def k_within_passages(self) -> EventIn:
        if self.k is not None and not 1 <= self.k <= len(self.passages):
            raise ValueError(
                f"k must be between 1 and the number of passages ({len(self.passages)}), "
                f"got {self.k}"
            )
        ids = [p.id for p in self.passages if p.id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("passage ids must be unique within an event")
        return self

    @property
    def effective_k(self) -> int:
        return self.k if self.k is not None else len(self.passages)


def check_limits(event: EventIn, settings: Settings) -> list[str]:
    """Every operator-set limit the event breaks, each as a message naming the limit."""
    problems: list[str] = []
    if len(event.passages) > settings.max_passages:
        problems.append(
            f"too many passages: {len(event.passages)} > max_passages {settings.max_passages}"
        )
    if len(event.query) > settings.max_query_chars:
        problems.append(
            f"query too long: {len(event.query)} characters > max_query_chars "
            f"{settings.max_query_chars}"
        )
    for rank, passage in enumerate(event.passages, start=1):
        if len(passage.text) > settings.max_passage_chars:
            problems.append(
                f"passage {rank} too long: {len(passage.text)} characters > max_passage_chars "
                f"{settings.max_passage_chars}"
            )
    for name in ("app", "retriever", "environment"):
        value = getattr(event, name)
        if value is not None and len(value) > settings.max_label_chars:
            problems.append(f"{name} too long: > max_label_chars {settings.max_label_chars}")
    if event.response is not None and len(event.response) > settings.max_response_chars:
        problems.append(response_too_long(event.response, settings))
    if event.gold_passage_ids is not None and len(event.gold_passage_ids) > settings.max_gold_ids:
        problems.append(
            f"too many gold_passage_ids: {len(event.gold_passage_ids)} > max_gold_ids "
            f"{settings.max_gold_ids}"
        )
    if event.metadata is not None:
        depth = nesting_depth(event.metadata)
        if depth > settings.max_metadata_depth:
            problems.append(
                f"metadata nested too deep: {depth} levels > max_metadata_depth "
                f"{settings.max_metadata_depth}"
            )
        size = len(json.dumps(event.metadata, separators=(",", ":")).encode())
        if size > settings.max_metadata_bytes:
            problems.append(
                f"metadata too large: {size} bytes > max_metadata_bytes "
                f"{settings.max_metadata_bytes}"
            )
    if event.candidates is not None and len(event.candidates) > settings.max_candidates:
        problems.append(
            f"too many candidates: {len(event.candidates)} > max_candidates "
            f"{settings.max_candidates}"
        )
    return problems


def response_too_long(response: str, settings: Settings) -> str:
    return (
        f"response too long: {len(response)} characters > max_response_chars "
        f"{settings.max_response_chars}"
    )


def check_feedback_limits(feedback: FeedbackIn, settings: Settings) -> list[str]:
    """Every operator-set limit the feedback breaks, each as a message naming the limit."""
    if feedback.response is not None and len(feedback.response) > settings.max_response_chars:
        return [response_too_long(feedback.response, settings)]
    return []


class DecodedEvents(list[EventIn]):
    """The events of a batch body already built from its bytes, every one valid
    (``service/contract/event_decoder.py``): a batch holding them passes as it is."""


def _decoded_pass(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    return value if type(value) is DecodedEvents else handler(value)


class BatchIn(CountedBody):
    model_config = ConfigDict(extra="forbid")

    # Raw events, or ``DecodedEvents`` (validated ``EventIn``) when the body was decoded whole;
    # a union would have every raw event tried as an ``EventIn`` too, and its errors reported.
    events: Annotated[
        list[dict[str, Any]],
        CountLimit("max_batch_events", "events in one batch"),
        WrapValidator(_decoded_pass),
    ] = Field(description="Events as in POST /v1/events; each is validated on its own.")


class FeedbackIn(StorableBody):
    model_config = ConfigDict(extra="forbid")

    response: str | None = None
    response_grade: StrictInt | None = Field(None, ge=1, le=5)
    answer_correct: bool | None = None

    @model_validator(mode="after")
    def something_given(self) -> FeedbackIn:
        if self.response is None and self.response_grade is None and self.answer_correct is None:
            raise ValueError("give response_grade, answer_correct or response")
        return self


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """Every 4xx and 503: a message a person can act on, and the field errors of a 422."""

    detail: str
    errors: list[ErrorItem] | None = None


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing, unknown or revoked API key."},
    422: {"model": ErrorBody, "description": "Malformed, or breaks a limit; says which."},
    503: {"model": ErrorBody, "description": "Overloaded or a dependency is down; Retry-After."},
}


IngestStatus = Literal["accepted", "duplicate", "rejected"]


class IngestResult(BaseModel):
    event_id: str | None
    status: IngestStatus
    error: str | None = None


class BatchResult(BaseModel):
    accepted: int
    duplicate: int
    rejected: int
    results: list[IngestResult]


class PassageView(BaseModel):
    id: str
    rank: int
    grade: int | None
    relevant: bool | None
    in_top_k: bool
    gold: bool | None


class EventView(BaseModel):
    event_id: str
    status: str
    timestamp: datetime
    received_at: datetime
    app: str
    retriever: str
    environment: str | None
    query: str
    k: int
    judge: str | None
    prompt_version: str | None
    context_rating: int | None
    passages: list[PassageView]
    measures: dict[str, float | None]
    gold_passage_ids: list[str] | None
    response_grade: int | None
    answer_correct: bool | None
    failure_reason: str | None
    texts_kept: bool = Field(
        True,
        description="False for an event stored narrow (RM_KEEP_TEXTS=needed: not chosen for "
        "judging): its query and passages were not stored, so query is empty and passages lists "
        "none; its counts, labels, status and feedback are kept.",
    )


# --- gold marked after the fact -----------------------------------------------------------------
GoldOutcomeName = Literal["answered", "not_retrieved", "not_in_corpus", "ambiguous"]
MAX_GOLD_PASSAGES = 200
MAX_LABELLER_CHARS = 100


class MissingPassageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: PassageId | None = Field(None, description="The answering passage's id in your corpus.")
    text: str | None = Field(None, min_length=1, description="Its text, when it has no id.")

    @model_validator(mode="after")
    def id_or_text(self) -> MissingPassageIn:
        if self.id is None and self.text is None:
            raise ValueError("give the passage's id or its text")
        return self


class GoldIn(StorableBody):
    """What a person concluded about an event: the passages that answer its query, or that
    no passage it was sent does."""

    model_config = ConfigDict(extra="forbid")

    outcome: GoldOutcomeName = Field(
        "answered",
        description="answered: passage_ids (among those sent) answer it; not_retrieved: a "
        "passage that was not sent does (missing_passage); not_in_corpus; ambiguous.",
    )
    passage_ids: list[PassageId] = Field(
        default_factory=list, max_length=MAX_GOLD_PASSAGES, description="For answered."
    )
    missing_passage: MissingPassageIn | None = Field(None, description="For not_retrieved.")
    answer_correct: bool | None = Field(None, description="Whether the response was correct.")
    labeller: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_LABELLER_CHARS,
        description="Who labelled, when the service needs no API key (with keys, the key is).",
    )

    @model_validator(mode="after")
    def fits_the_outcome(self) -> GoldIn:
        if self.outcome == "answered" and not self.passage_ids:
            raise ValueError("outcome answered needs passage_ids: the passages that answer")
        if self.outcome != "answered" and self.passage_ids:
            raise ValueError(f"outcome {self.outcome} marks no sent passage: drop passage_ids")
        if (self.outcome == "not_retrieved") != (self.missing_passage is not None):
            raise ValueError("missing_passage goes with outcome not_retrieved, and only with it")
        return self


class GoldLabelView(BaseModel):
    event_id: str
    labeller: str
    labeller_name: str
    outcome: GoldOutcomeName
    passage_ids: list[str]
    missing_text: str | None
    answer_correct: bool | None
    labelled_at: datetime


class EventGoldView(BaseModel):
    event_id: str
    labels: list[GoldLabelView]
    status: Literal["unlabelled", "single", "agreed", "disagreed"]
    gold_passage_ids: list[str] | None = Field(description="The gold the analysis uses.")
    answer_correct: bool | None
