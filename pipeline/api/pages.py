"""The status page: runs, batches and a run's timeline, and pending approvals to decide.

Server-rendered HTML (Jinja2, autoescaped). People sign in with their own token (`nightshift
tokens create --for ...`), or are signed in by a trusted proxy's identity header; the session
is a server-side row behind a signed cookie (HttpOnly, SameSite=Strict: pipeline/api/sessions.py)
and every form, the sign-in form included, carries a CSRF token. Decisions
go through pipeline.runs.decisions.decide, the same single-use decision as the webhook, as
whom the session speaks for.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.templating import Jinja2Templates

from models import ActionState, RunStatus
from pipeline.api import tokens, words
from pipeline.api.auth import proxy_identity
from pipeline.api.base import ApiConfig, status_for
from pipeline.api.sessions import (
    COOKIE,
    LOGIN_COOKIE,
    LOGIN_MAX_AGE_SECONDS,
    Sessions,
    WebSession,
    session_key,
)
from pipeline.api.sse import event_stream
from pipeline.errors import (
    Invalid,
    Malformed,
    NightshiftError,
    Refused,
    Unauthenticated,
    UnsupportedMediaType,
)
from pipeline.keys import entry_kind
from pipeline.runs.decisions import Actor, Decision, Seen, decide, retry
from pipeline.settings import get_settings
from pipeline.views.actions import ATTENTION, count_actions, list_actions, show_action
from pipeline.views.alerts import list_alerts
from pipeline.views.artifacts import read_artifact
from pipeline.views.batches import list_batches, show_batch
from pipeline.views.feed import Subject, format_position, latest_position
from pipeline.views.liveness import queue_liveness, stall
from pipeline.views.runs import list_runs, resolve_run_id, show_run

WEB = Path(__file__).parent / "web"
MAX_FORM_FIELDS = 20
MAX_NOTE = 2000
CHILDREN_A_PAGE = 100
"""A batch's page lists its children this many at a time, under their counts by status."""

templates = Jinja2Templates(
    env=Environment(loader=FileSystemLoader(WEB), autoescape=select_autoescape(default=True))
)
templates.env.filters["quote"] = lambda value: quote(str(value), safe="")
router = APIRouter(include_in_schema=False)


def install(app: FastAPI, config: ApiConfig) -> None:
    app.state.sessions = Sessions(session_key(config.session_secret, get_settings().data_dir))
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=WEB / "static"), name="static")


# -- sessions -------------------------------------------------------------------------------


def _signer(request: Request) -> Sessions:
    signer: Sessions = request.app.state.sessions
    return signer


def _config(request: Request) -> ApiConfig:
    config: ApiConfig = request.app.state.config
    return config


def signed_in(request: Request) -> bool:
    """Whether the browser holds a live status-page session (the docs pages ask)."""
    return _session(request) is not None


def _session(request: Request) -> WebSession | None:
    """The signed-in session, while what signed it in still holds: the token is not revoked,
    or the proxy still sends the same identity. (Sync: it may ask the database.)"""
    session = _signer(request).read(request.cookies.get(COOKIE))
    if session is None:
        return None
    if session.token_id is not None:
        still = tokens.active(session.token_id)
        return session if still is not None and still.actor.identity == session.who else None
    if "proxy header" in session.via:
        proxied = _proxied(request)
        return session if proxied is not None and proxied.actor.identity == session.who else None
    return session if _config(request).insecure_no_auth else None


def _proxied(request: Request) -> tokens.Authenticated | None:
    client = request.client.host if request.client else None
    return proxy_identity(_config(request), request.headers, client)


def _signed_in(request: Request, found: tokens.Authenticated) -> RedirectResponse:
    """Begin a session for `found` (sync: it writes the session's row)."""
    response = RedirectResponse("/ui", status_code=303)
    via = found.actor.via.removeprefix("status page, ")
    cookie = _signer(request).begin(found.actor.identity, f"status page, {via}", found.token_id)
    response.delete_cookie(LOGIN_COOKIE, path="/ui/login", httponly=True, samesite="strict")
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=_signer(request).max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


def _to_login() -> RedirectResponse:
    return RedirectResponse("/ui/login", status_code=303)


async def _form(request: Request) -> dict[str, str]:
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise UnsupportedMediaType("expected a form (application/x-www-form-urlencoded)")
    try:
        text = (await request.body()).decode()
        return dict(parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS))
    except (UnicodeDecodeError, ValueError):
        raise Malformed("the form could not be read") from None


def _page(
    request: Request,
    name: str,
    session: WebSession | None,
    status: int = 200,
    **context: Any,
) -> Response:
    csrf = _signer(request).csrf_token(session) if session else ""
    attention = count_actions(ATTENTION) if session else 0
    context = {"session": session, "csrf": csrf, "RunStatus": RunStatus,
               "attention_count": attention, **context}  # fmt: skip
    return templates.TemplateResponse(request, name, context, status_code=status)


def _failure(request: Request, session: WebSession | None, exc: NightshiftError) -> Response:
    status = status_for(exc)
    message = str(exc) if status < 500 else "internal error; the server log has the details"
    return _page(request, "error.html", session, status=status, message=message)


# -- sign in and out ------------------------------------------------------------------------


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=303)


@router.get("/ui/login")
def login_form(request: Request) -> Response:
    if _session(request) is not None:
        return RedirectResponse("/ui", status_code=303)
    proxied = _proxied(request)
    if proxied is not None:  # the proxy signed the person in: nothing to type
        return _signed_in(request, proxied)
    return _login_page(request)


def _login_page(request: Request, refused: NightshiftError | None = None) -> Response:
    """The sign-in form (saying why the last sign-in was refused), with a fresh CSRF value in a
    cookie of its own and in the form."""
    nonce = uuid.uuid4().hex
    status = 200 if refused is None else status_for(refused)
    error = None if refused is None else str(refused)
    response = _page(
        request, "login.html", None, status=status, error=error,
        insecure=_config(request).insecure_no_auth, csrf=_signer(request).login_csrf(nonce),
    )  # fmt: skip
    response.set_cookie(
        LOGIN_COOKIE,
        nonce,
        max_age=LOGIN_MAX_AGE_SECONDS,
        path="/ui/login",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/ui/login")
async def login(request: Request) -> Response:
    fields = await _form(request)
    if not _signer(request).login_csrf_matches(
        request.cookies.get(LOGIN_COOKIE), fields.get("csrf")
    ):  # another site posting a token of its own would sign this browser in as that person
        return _login_page(request, StaleForm())
    config = _config(request)
    token = fields.get("token", "").strip()
    found = None
    if token and config.token_matches(token):
        problem = (
            "The shared API token names nobody, and decisions here are recorded in a person's "
            "name: sign in with your own token (nightshift tokens create --for you@example.com)."
        )
    elif token:
        found = await run_in_threadpool(tokens.authenticate, token)
        problem = "That token is unknown or revoked."
    elif config.insecure_no_auth:
        found = tokens.Authenticated(Actor(tokens.ANONYMOUS, "no authentication"))
    else:
        problem = "Enter your token."
    if found is None:
        return _login_page(request, Unauthenticated(problem))
    return await run_in_threadpool(_signed_in, request, found)


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    session = await run_in_threadpool(_session, request)
    fields = await _form(request)
    if session is not None and not _signer(request).csrf_matches(session, fields.get("csrf")):
        return _failure(request, session, StaleForm())
    await run_in_threadpool(_signer(request).end, request.cookies.get(COOKIE))
    response = _to_login()
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


class StaleForm(Refused):
    """This form is stale or was not sent by the status page; reload the page and retry."""


# -- pages ----------------------------------------------------------------------------------


def _to_decide(limit: int) -> dict[str, Any]:
    """What waits for a person, as the dashboard and the attention page list it: approvals,
    and sends whose outcome nobody knows."""
    return {
        "approvals": list_actions(state=ActionState.PENDING_APPROVAL, limit=limit),
        "unknown": list_actions(state=ActionState.OUTCOME_UNKNOWN, limit=limit),
    }


@router.get("/ui")
def dashboard(request: Request, status: str | None = None) -> Response:
    session = _session(request)
    if session is None:
        return _to_login()
    chosen = status if status in {s.value for s in RunStatus} else None
    return _page(
        request,
        "dashboard.html",
        session,
        **_to_decide(limit=100),
        alerts=list_alerts(limit=10),
        batches=[b.as_json() for b in list_batches(limit=20)],
        runs=list_runs(status=chosen, limit=50),
        chosen=chosen,
        no_worker=queue_liveness().no_worker(),
    )


@router.get("/ui/runs/{run_id}")
def run_page(request: Request, run_id: str) -> Response:
    session = _session(request)
    if session is None:
        return _to_login()
    try:
        wanted = resolve_run_id(run_id)
        # Before reading the run: whatever commits from here on arrives as an event (the
        # page drops what it already shows), so nothing falls between the two.
        after = format_position(latest_position())
        detail = show_run(wanted, full=True)
    except NightshiftError as exc:
        return _failure(request, session, exc)
    run = detail["run"]
    updated = datetime.fromisoformat(run["updated_at"])
    stalled = stall(run["status"], run["lease_owner"], updated, queue_liveness(), get_settings())
    return _page(
        request, "run.html", session, steps=_timeline(detail["journal"]), stalled=stalled,
        after=after, **detail,
    )  # fmt: skip


@router.get("/ui/runs/{run_id}/events")
async def run_feed(request: Request, run_id: str) -> Response:
    """The run page's live feed: the API's event stream, behind the page's session."""
    if _session(request) is None:
        raise Unauthenticated("sign in first (/ui/login)")
    subject = Subject(run_id=await run_in_threadpool(resolve_run_id, run_id))
    return await event_stream(subject, _last_event_id(request), lambda: signed_in(request))


@router.get("/ui/batches/{batch_id:path}/events")
async def batch_feed(request: Request, batch_id: str) -> Response:
    if _session(request) is None:
        raise Unauthenticated("sign in first (/ui/login)")
    subject = Subject(batch_id=batch_id)
    return await event_stream(subject, _last_event_id(request), lambda: signed_in(request))


def _last_event_id(request: Request) -> str | None:
    """EventSource sends Last-Event-ID when it reconnects; the first connection says where
    the rendered page left off with ?after=."""
    return request.headers.get("last-event-id") or request.query_params.get("after")


def _timeline(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Journal entries grouped by step, each marked model, tool or note."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for entry in journal:
        kind = str(entry_kind(entry["key"]) or "")
        steps.setdefault(entry["step"], []).append({**entry, "kind": kind})
    return [{"step": step, "entries": entries} for step, entries in sorted(steps.items())]


@router.get("/ui/runs/{run_id}/artifacts/{artifact_id}")
def artifact_page(request: Request, run_id: str, artifact_id: int) -> Response:
    """An artifact to read: markdown rendered (escaped, no raw HTML), other text as it is."""
    session = _session(request)
    if session is None:
        return _to_login()
    try:
        run = resolve_run_id(run_id)
        artifact = read_artifact(run, artifact_id)
    except NightshiftError as exc:
        return _failure(request, session, exc)
    return _page(request, "artifact.html", session, artifact=artifact, run_id=str(run))


@router.get("/ui/attention")
def attention_page(request: Request) -> Response:
    """What a person must decide: approvals, and sends whose outcome nobody knows."""
    session = _session(request)
    if session is None:
        return _to_login()
    return _page(
        request,
        "attention.html",
        session,
        **_to_decide(limit=200),
    )


@router.get("/ui/batches/{batch_id:path}/progress")
def batch_progress(request: Request, batch_id: str) -> dict[str, Any]:
    """The batch as GET /batches/{id} shows it: what its page's counts follow, since the page
    lists only a page of the children."""
    if _session(request) is None:
        raise Unauthenticated("sign in first (/ui/login)")
    return show_batch(batch_id).as_json()


@router.get("/ui/batches/{batch_id:path}")
def batch_page(request: Request, batch_id: str, page: int = 1) -> Response:
    session = _session(request)
    if session is None:
        return _to_login()
    try:
        after = format_position(latest_position())
        batch = show_batch(batch_id).as_json()
    except NightshiftError as exc:
        return _failure(request, session, exc)
    page = max(page, 1)
    first = (page - 1) * CHILDREN_A_PAGE
    runs = list_runs(batch=batch_id, limit=CHILDREN_A_PAGE, offset=first)
    total = batch["children"]["total"]
    pages = {
        "first": first + 1 if runs else first,
        "last": first + len(runs),
        "total": total,
        "newer": page - 1 if page > 1 else None,
        "older": page + 1 if first + len(runs) < total else None,
    }
    return _page(request, "batch.html", session, batch=batch, runs=runs, pages=pages, after=after)


@router.get("/ui/actions/{key:path}")
def action_page(
    request: Request, key: str, repeated: int = 0, decided: str | None = None
) -> Response:
    session = _session(request)
    if session is None:
        return _to_login()
    try:
        action = show_action(key)
    except NightshiftError as exc:
        return _failure(request, session, exc)
    return _page(
        request, "action.html", session, action=action, repeated=bool(repeated),
        confirmation=CONFIRMATIONS.get(decided or "") if not repeated else None,
    )  # fmt: skip


CONFIRMATIONS: dict[str, str] = {
    Decision.APPROVE: "You approved it. The run goes on and sends it now, once.",
    Decision.REJECT: "You rejected it. The run goes on without it; nothing is sent.",
    Decision.HAPPENED: "Recorded: it happened. It will not be sent again; the run goes on.",
    Decision.DID_NOT_HAPPEN: "Recorded: it did not happen. The run sends it again now, once.",
    "retry": "Retried: its failure is no longer replayed; the next run that means it does it.",
}
"""What the page says after a person's decision, in place of the state's code."""


@router.post("/ui/actions/{key:path}")
async def decide_page(request: Request, key: str) -> Response:
    """Decide from the page, in the signed-in person's name: approve or reject (the same
    single-use decision as the webhook, applied only to the action as the page showed it), say
    what happened to an unknown outcome, or retry a failed action."""
    session = await run_in_threadpool(_session, request)
    if session is None:
        return _to_login()
    fields = await _form(request)
    if not _signer(request).csrf_matches(session, fields.get("csrf")):
        return _failure(request, session, StaleForm())
    decision = fields.get("decision")
    if decision not in _PAGE_DECISIONS:
        message = f"decision must be one of {', '.join(_PAGE_DECISIONS)}"
        return _failure(request, session, Invalid(message))
    note = (fields.get("note") or "").strip()[:MAX_NOTE] or None
    actor = Actor(session.who, session.via)
    try:
        if decision == "retry":
            await run_in_threadpool(retry, key, actor, note)
            return RedirectResponse(f"/ui/actions/{quote(key, safe='')}?decided=retry", 303)
        seen = _seen(fields)
        result = await run_in_threadpool(decide, key, decision, actor, note, seen)
    except NightshiftError as exc:
        try:
            action = await run_in_threadpool(show_action, key)
        except NightshiftError:
            return _failure(request, session, exc)
        return _page(
            request, "action.html", session, status=status_for(exc), action=action,
            error=str(exc), repeated=False,
        )  # fmt: skip
    target = f"/ui/actions/{quote(key, safe='')}"
    shown = f"?decided={result.decision.value}" if result.first else "?repeated=1"
    return RedirectResponse(target + shown, status_code=303)


_PAGE_DECISIONS = ("approve", "reject", "happened", "did_not_happen", "retry")


def _seen(fields: dict[str, str]) -> Seen:
    """The run and arguments the form showed (blank when the form predates them)."""
    try:
        run_id = uuid.UUID(fields["run_id"]) if fields.get("run_id") else None
    except ValueError:
        raise Malformed("the form's run_id is not a run id") from None
    return Seen(run_id, fields.get("args_hash") or None)


def _run_link(run_id: str | uuid.UUID) -> str:
    return f"/ui/runs/{run_id}"


templates.env.globals |= {
    "run_link": _run_link,
    "plain": words.plain,
    "action_words": words.action_words,
    "waiting_words": words.waiting_words,
    "who_decides": words.who_decides,
}
templates.env.filters["markdown"] = lambda text: Markup(words.markdown(text))
