"""The built-in pages under /ui: overview, events, misses, and the login form.

Server-rendered HTML; the only script records a miss's cause. Everything the pages load comes
from this service (no fonts or scripts from elsewhere), so they work air-gapped.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from sqlmodel import Session

from service.auth.browser import (
    COOKIE_MAX_AGE_SECONDS,
    UI_HEADER,
    UI_HEADER_VALUE,
    safe_next,
    served_over_tls,
)
from service.auth.keys import key_hash
from service.auth.sessions import COOKIE_NAME
from service.http.deps import PageCaller, StateDep
from service.http.state import app_state
from service.measures.catalogue import LISTED, MEASURE_NAMES
from service.store import events as event_store
from service.store import gold as gold_store
from service.store import pages as page_store
from service.store.engine import session_scope
from service.store.pages import UNCLASSIFIED
from service.ui import views
from service.ui.api import labelled_miss
from service.ui.filters import WINDOWS, EventFilter, parse_filter
from service.ui.render import MISS_CAUSE_TITLES, render

router = APIRouter(prefix="/ui", include_in_schema=False)
STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"ui.css": "text/css", "ui.js": "text/javascript", "label.js": "text/javascript"}
MAX_LOGIN_BODY = 4096

# Everything from this origin only; inline scripts and styles are refused, so a passage that
# slipped a tag past the escaping still could not run anything.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _page(request: Request, template: str, status_code: int = 200, **context: object) -> Response:
    state = app_state(request)
    body = render(
        template,
        path=request.url.path,
        auth_required=state.runtime.settings.auth_required,
        ui_header=UI_HEADER,
        ui_header_value=UI_HEADER_VALUE,
        **context,
    )
    return HTMLResponse(body, status_code=status_code, headers=SECURITY_HEADERS)


def _filter(request: Request) -> EventFilter:
    return parse_filter(dict(request.query_params))


@router.get("", response_class=HTMLResponse)
def overview_page(request: Request, state: StateDep, caller: PageCaller) -> Response:
    chosen = _filter(request)
    with session_scope(state.runtime.engine) as session:
        data = page_store.overview(session, caller.tenant, chosen.window)
    return _page(
        request,
        "overview.html",
        title="Overview",
        chosen=chosen,
        windows=list(WINDOWS),
        data=data,
        panels=views.overview_panels(data),
        alpha=state.runtime.settings.alpha,
    )


@router.get("/events", response_class=HTMLResponse)
def events_page(request: Request, state: StateDep, caller: PageCaller) -> Response:
    chosen = _filter(request)
    with session_scope(state.runtime.engine) as session:
        page = page_store.list_events(session, caller.tenant, chosen)
        choices = page_store.label_choices(session, caller.tenant, chosen.window)
    return _page(
        request,
        "events.html",
        title="Events",
        chosen=chosen,
        windows=list(WINDOWS),
        choices=choices,
        measures=MEASURE_NAMES,
        page=page,
        columns=LISTED,
    )


@router.get("/events/{event_id}", response_class=HTMLResponse)
def event_page(event_id: str, request: Request, state: StateDep, caller: PageCaller) -> Response:
    with session_scope(state.runtime.engine) as session:
        event = event_store.find_event(session, caller.tenant, event_id)
        if event is None or event.id is None:
            return _not_found(request, event_id)
        stored = with_label_gold(session, event_store.stored_event(session, event))
        is_miss = page_store.is_gold_miss(session, event.id) or labelled_miss(session, event)
        cause = page_store.find_cause(session, event.id)
    return _page(
        request,
        "event.html",
        title=f"Event {event_id}",
        stored=stored,
        event=stored.event,
        groups=views.passage_groups(views.passage_rows(stored), stored.event.k),
        measures=views.measures_of(stored),
        is_miss=is_miss,
        cause=cause,
        quoted_id=quote(event_id, safe=""),
    )


@router.get("/misses", response_class=HTMLResponse)
def misses_page(request: Request, state: StateDep, caller: PageCaller) -> Response:
    chosen = _filter(request)
    with session_scope(state.runtime.engine) as session:
        counts = page_store.cause_counts(session, caller.tenant, chosen)
        page = page_store.list_events(session, caller.tenant, chosen, misses_only=True)
        ranks = page_store.gold_ranks(session, [row.pk for row in page.rows])
        choices = page_store.label_choices(session, caller.tenant, chosen.window)
    return _page(
        request,
        "misses.html",
        title="Misses",
        chosen=chosen,
        windows=list(WINDOWS),
        choices=choices,
        counts=counts,
        page=page,
        ranks=ranks,
        cause_keys=[*MISS_CAUSE_TITLES, UNCLASSIFIED],
        cause_options=[(key.value, title) for key, title in MISS_CAUSE_TITLES.items()]
        + [(UNCLASSIFIED, UNCLASSIFIED)],
        detail_query=chosen.query_string(page=1, cause=None),
    )


@router.get("/misses/{event_id}", response_class=HTMLResponse)
def miss_page(event_id: str, request: Request, state: StateDep, caller: PageCaller) -> Response:
    chosen = _filter(request)
    with session_scope(state.runtime.engine) as session:
        event = event_store.find_event(session, caller.tenant, event_id)
        if event is None or event.id is None:
            return _not_found(request, event_id)
        stored = with_label_gold(session, event_store.stored_event(session, event))
        is_miss = page_store.is_gold_miss(session, event.id) or labelled_miss(session, event)
        cause = page_store.find_cause(session, event.id)
        following = page_store.next_unclassified_miss(session, caller.tenant, chosen, event.id)
    rows = views.passage_rows(stored)
    return _page(
        request,
        "miss.html",
        title=f"Miss {event_id}",
        event=stored.event,
        stored=stored,
        is_miss=is_miss,
        gold=views.gold_side(stored, rows),
        prompt=[row for row in rows if row.in_prompt],
        sent=len(rows),
        measures=views.measures_of(stored),
        cause=cause,
        causes=MISS_CAUSE_TITLES,
        quoted_id=quote(event_id, safe=""),
        following=following,
        list_query=chosen.query_string(page=1, cause=None),
    )


def with_label_gold(session: Session, stored: event_store.StoredEvent) -> event_store.StoredEvent:
    """The event as the analysis sees it: with the gold people marked later, when they did
    (``service.store.gold`` gives the rule), in place of the gold it was sent with."""
    event = stored.event
    assert event.id is not None
    labels = gold_store.labels_of(session, [event.id]).get(event.id)
    if not labels:
        return stored
    agreed = gold_store.consensus(event.gold_passage_ids, event.answer_correct, labels)
    shown = event.model_copy(
        update={
            "gold_passage_ids": agreed.gold_passage_ids,
            "answer_correct": agreed.answer_correct,
        }
    )
    return replace(stored, event=shown)


def _not_found(request: Request, event_id: str) -> Response:
    return _page(
        request,
        "not_found.html",
        status_code=status.HTTP_404_NOT_FOUND,
        title="Not found",
        event_id=event_id,
    )


# --- login --------------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, state: StateDep) -> Response:
    target = safe_next(request.query_params.get("next"))
    if not state.runtime.settings.auth_required:
        return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
    return _page(request, "login.html", title="Log in", next=target, error=None)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, state: StateDep) -> Response:
    """Check the key and keep it in an HttpOnly cookie the browser sends back to this site only."""
    body = await request.body()
    if len(body) > MAX_LOGIN_BODY:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail="login form too large")
    fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    key = (fields.get("key") or [""])[0].strip()
    target = safe_next((fields.get("next") or [""])[0])
    if not state.runtime.settings.auth_required:
        return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
    if not key or state.keys.principal(key) is None:
        return _page(
            request,
            "login.html",
            status_code=status.HTTP_401_UNAUTHORIZED,
            title="Log in",
            next=target,
            error="Unknown or revoked API key.",
        )
    response = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        COOKIE_NAME,
        state.sessions.open(key_hash(key)),
        max_age=COOKIE_MAX_AGE_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=served_over_tls(request, state.runtime.settings.trust_forwarded_proto),
    )
    return response


@router.post("/logout")
def logout(request: Request, state: StateDep) -> Response:
    """End the session on the server (a copy of the cookie stops working) and drop the cookie."""
    token = request.cookies.get(COOKIE_NAME)
    if token:
        state.sessions.close(token)
    response = RedirectResponse("/ui/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return response


# --- static files -------------------------------------------------------------------------------


@router.get("/static/{name}")
def static_file(name: str) -> Response:
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no static file {name!r}")
    return FileResponse(
        STATIC / name,
        media_type=media_type,
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
