"""/ui/label: the labelling queue. A seeded, stratified sample of a window's events, one event at
a time with every passage it sent, and the article's figures of what is labelled so far.

The window is made absolute on the first visit (a redirect), so the address names the sample:
the same address draws the same events again. Labels are saved through the gold API
(``POST /v1/events/{id}/gold``) by ``static/label.js``; the page itself only reads. Judge grades
are not shown while labelling, so they cannot sway the person the judge is checked against.

Who labels is the API key behind the login. Without keys every caller is the same anonymous
one, so the page asks for a name instead ("you are"), keeps it in a cookie and sends it as the
gold API's ``labeller``: two people labelling the same sample stay two labellers, and their
agreement can be measured. With keys the key's identity wins and the name is not asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import parse_qs, quote, unquote, urlencode

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.analysis.gold_queue import QueueState, queue_state
from service.analysis.window import parse_span, resolve_window
from service.auth.browser import safe_next
from service.auth.keys import Principal
from service.auth.labellers import labeller_of
from service.contract.client_text import mask_text
from service.contract.schemas import MAX_LABELLER_CHARS
from service.contract.storable import text_problem
from service.http.deps import PageCaller, StateDep
from service.primitives.clock import utcnow
from service.store import events as event_store
from service.store import gold as gold_store
from service.store.analysis import EventWindow
from service.store.engine import session_scope
from service.store.models import GoldOutcome
from service.ui import views
from service.ui.pages import _page

router = APIRouter(prefix="/ui", include_in_schema=False)

DEFAULT_SINCE = "7d"
DEFAULT_TARGET = 50
MAX_TARGET = 2000
LABELLER_COOKIE = "rm_labeller"
LABELLER_COOKIE_SECONDS = 365 * 24 * 3600
MAX_NAME_FORM = 4096

# The keys of the page, also listed on it and in docs/ui.md.
OUTCOME_KEYS = {
    GoldOutcome.ANSWERED.value: ("a", "Answered by the marked passages"),
    GoldOutcome.NOT_RETRIEVED.value: ("m", "Missed: a passage that was not sent answers it"),
    GoldOutcome.NOT_IN_CORPUS.value: ("x", "Not in the corpus"),
    GoldOutcome.AMBIGUOUS.value: ("q", "Ambiguous question"),
}
CORRECT_KEYS = (("y", "true", "correct"), ("w", "false", "wrong"), ("u", "", "not judged"))


@dataclass(frozen=True)
class QueueAddress:
    """What names a sample: the absolute window, its strata filter, the seed and the target."""

    since: datetime
    until: datetime
    app: str | None
    retriever: str | None
    seed: int
    target: int

    def query(self, **extra: str) -> str:
        values = {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "seed": str(self.seed),
            "target": str(self.target),
        }
        if self.app:
            values["app"] = self.app
        if self.retriever:
            values["retriever"] = self.retriever
        values.update(extra)
        return urlencode(values)


def _int(raw: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(raw) if raw not in (None, "") else default
    except ValueError:
        return default
    return min(max(value, low), high)


def _absolute(text: str) -> bool:
    """A moment that means the same tomorrow: not "now", not a span back from now."""
    return text.strip().lower() != "now" and parse_span(text) is None


def _address(request: Request) -> tuple[QueueAddress, bool, list[str]]:
    """The sample the address names, whether it was already absolute, and what was ignored."""
    params = request.query_params
    errors: list[str] = []
    since_raw, until_raw = params.get("since") or DEFAULT_SINCE, params.get("until") or None
    now = utcnow()
    try:
        since, until = resolve_window(since_raw, until_raw, now)
    except ValueError as exc:
        errors.append(f"window: {exc}; the last {DEFAULT_SINCE} is shown")
        since, until = resolve_window(DEFAULT_SINCE, None, now)
    # Only a window that parsed is asked whether it is absolute: an unparseable span raises.
    absolute = (
        not errors and until_raw is not None and _absolute(since_raw) and _absolute(until_raw)
    )
    address = QueueAddress(
        since=since,
        until=until,
        app=params.get("app") or None,
        retriever=params.get("retriever") or None,
        seed=_int(params.get("seed"), 0, 0, 2**31 - 1),
        target=_int(params.get("target"), DEFAULT_TARGET, 1, MAX_TARGET),
    )
    return address, absolute and not errors, errors


@router.get("/label", response_class=HTMLResponse)
def label_page(request: Request, state: StateDep, caller: PageCaller) -> Response:
    address, absolute, errors = _address(request)
    if not absolute and not errors:
        # Pin the window so the address keeps naming the same sample.
        asked = request.query_params.get("event")
        pinned = address.query(event=asked) if asked else address.query()
        return RedirectResponse(f"/ui/label?{pinned}", status_code=status.HTTP_303_SEE_OTHER)
    name = named_labeller(request, caller)
    labeller = labeller_of(caller, name)[0]
    window = EventWindow(
        address.since,
        address.until,
        app=address.app,
        retriever=address.retriever,
        tenant=caller.tenant,
        max_events=state.runtime.settings.max_read_events,
    )
    wanted = request.query_params.get("event")
    with session_scope(state.runtime.engine) as session:
        queue = queue_state(
            session, window, seed=address.seed, target=address.target, labeller=labeller
        )
        current = next((c for c in queue.sample if c.event_id == wanted), None)
        if current is None:
            current = queue.next_for()
        stored = mine = None
        if current is not None:
            event = event_store.find_event(session, caller.tenant, current.event_id)
            if event is not None and event.id is not None:
                stored = event_store.stored_event(session, event)
                labels = gold_store.labels_of(session, [event.id]).get(event.id, [])
                mine = next((row for row in labels if row.labeller == labeller), None)
    following = queue.next_for(current.pk, skip=current.pk) if current is not None else None
    position = next(
        (i for i, c in enumerate(queue.sample, start=1) if current and c.pk == current.pk), 0
    )
    return _page(
        request,
        "label.html",
        title="Label",
        address=address,
        errors=errors,
        queue=queue,
        progress=progress_rows(queue),
        stored=stored,
        rows=views.passage_rows(stored) if stored is not None else [],
        mine=mine,
        position=position,
        quoted_id=quote(current.event_id, safe="") if current is not None else "",
        next_url=(
            f"/ui/label?{address.query(event=following.event_id)}"
            if following is not None
            else f"/ui/label?{address.query()}"
        ),
        outcome_keys=OUTCOME_KEYS,
        correct_keys=CORRECT_KEYS,
        ask_name=caller.labeller is None,
        labeller_name=name or "",
        max_name=MAX_LABELLER_CHARS,
        here=f"/ui/label?{request.url.query}",
    )


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a labeller, or None when it can."""
    if len(name) > MAX_LABELLER_CHARS:
        return f"a name is at most {MAX_LABELLER_CHARS} characters"
    problem = text_problem(name)
    return None if problem is None else f"the name {problem}"


def named_labeller(request: Request, caller: Principal) -> str | None:
    """The name the browser's cookie gives, when there is no key to say who labels."""
    if caller.labeller is not None:
        return None
    raw = request.cookies.get(LABELLER_COOKIE)
    if not raw:
        return None
    name = unquote(raw).strip()
    # A cookie is the browser's to change: one that does not fit is ignored, not trusted.
    if not name or name_problem(name) is not None:
        return None
    # Masked as the gold API masks a labeller named in its body, so both name one labeller.
    return mask_text(name)[:MAX_LABELLER_CHARS]


@router.post("/label/labeller")
async def set_labeller(request: Request, caller: PageCaller) -> Response:
    """Keep the name typed in "you are" in a cookie and go back to the queue; an empty name
    forgets it (labels are then anonymous)."""
    if caller.labeller is not None:
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail="the API key says who labels; no name is taken"
        )
    body = await request.body()
    if len(body) > MAX_NAME_FORM:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail="name form too large")
    fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    name = (fields.get("name") or [""])[0].strip()
    problem = name_problem(name)
    if problem is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=problem)
    response = RedirectResponse(
        safe_next((fields.get("back") or [""])[0]), status_code=status.HTTP_303_SEE_OTHER
    )
    if name:
        response.set_cookie(
            LABELLER_COOKIE,
            quote(name, safe=""),
            max_age=LABELLER_COOKIE_SECONDS,
            path="/ui",
            httponly=True,
            samesite="strict",
        )
    else:
        response.delete_cookie(LABELLER_COOKIE, path="/ui", httponly=True, samesite="strict")
    return response


@dataclass(frozen=True)
class Figure:
    key: str
    title: str
    value: float
    low: float
    high: float
    n: int


def progress_rows(queue: QueueState) -> list[Figure]:
    """The article's figures of the labelled sample, each with its 95% interval."""
    report = queue.report
    if report is None:
        return []
    k = f"{report.median_k:g}"
    estimates = [
        ("recall", f"Recall@{k} (the prompt's k)", report.ceiling_recall),
        ("mrr", f"MRR@{k}", report.mrr),
        ("ceiling", "Ceiling (gold in the prompt)", report.ceiling),
        ("conversion", "Conversion (right with gold in hand)", report.conversion),
        ("predicted", "Predicted accuracy (ceiling x conversion)", report.predicted_accuracy),
        ("observed", "Observed accuracy", report.observed_accuracy),
    ]
    return [Figure(key, title, e.value, e.low, e.high, e.n) for key, title, e in estimates]
