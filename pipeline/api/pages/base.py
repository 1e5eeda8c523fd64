"""What every page shares: the templates, the signed-in session, forms, and rendering a page
or a failure."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.templating import Jinja2Templates

from models import RunStatus
from pipeline.api import tokens, words
from pipeline.api.auth import caller, proxy_identity
from pipeline.api.base import ApiConfig, status_for
from pipeline.api.sessions import COOKIE, Sessions, WebSession
from pipeline.errors import Malformed, NightshiftError, Refused, UnsupportedMediaType
from pipeline.views.actions import ATTENTION, count_actions

WEB = Path(__file__).parents[1] / "web"
MAX_FORM_FIELDS = 20


def run_link(run_id: str | uuid.UUID) -> str:
    return f"/ui/runs/{run_id}"


templates = Jinja2Templates(
    env=Environment(loader=FileSystemLoader(WEB), autoescape=select_autoescape(default=True))
)
templates.env.filters["quote"] = lambda value: quote(str(value), safe="")
templates.env.filters["markdown"] = lambda text: Markup(words.markdown(text))
templates.env.globals |= {
    "run_link": run_link,
    "plain": words.plain,
    "action_words": words.action_words,
    "waiting_words": words.waiting_words,
    "who_decides": words.who_decides,
}


# The status page's own refusal (only its forms raise it), so it stays at this edge.
class StaleForm(Refused):
    """This form is stale or was not sent by the status page; reload the page and retry."""


# -- the session ----------------------------------------------------------------------------


def signer(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


def config(request: Request) -> ApiConfig:
    api_config: ApiConfig = request.app.state.config
    return api_config


def signed_in(request: Request) -> bool:
    """Whether the browser holds a live status-page session (the docs pages ask)."""
    return current_session(request) is not None


def proves_someone(request: Request) -> bool:
    """A credential the API accepts (a bearer token, the proxy's identity header), or the
    browser's live status-page session. (Sync: it may ask the database.)"""
    header = request.headers.get("authorization", "")
    bearer = header[7:].strip() if header[:7].lower() == "bearer " else None
    client = request.client.host if request.client else None
    if caller(config(request), request.headers, client, bearer) is not None:
        return True
    return signed_in(request)


def current_session(request: Request) -> WebSession | None:
    """The signed-in session, while what signed it in still holds: the token is not revoked,
    or the proxy still sends the same identity. (Sync: it may ask the database.)"""
    found = signer(request).read(request.cookies.get(COOKIE))
    if found is None:
        return None
    if found.token_id is not None:
        still = tokens.active(found.token_id)
        return found if still is not None and still.actor.identity == found.who else None
    if "proxy header" in found.via:
        by_proxy = proxied(request)
        return found if by_proxy is not None and by_proxy.actor.identity == found.who else None
    return found if config(request).insecure_no_auth else None


def proxied(request: Request) -> tokens.Authenticated | None:
    client = request.client.host if request.client else None
    return proxy_identity(config(request), request.headers, client)


def to_login() -> RedirectResponse:
    return RedirectResponse("/ui/login", status_code=303)


# -- forms and rendering --------------------------------------------------------------------


async def read_form(request: Request) -> dict[str, str]:
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise UnsupportedMediaType("expected a form (application/x-www-form-urlencoded)")
    try:
        text = (await request.body()).decode()
        return dict(parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS))
    except (UnicodeDecodeError, ValueError):
        raise Malformed("the form could not be read") from None


def render(
    request: Request,
    name: str,
    session: WebSession | None,
    status: int = 200,
    **context: Any,
) -> Response:
    csrf = signer(request).csrf_token(session) if session else ""
    attention = count_actions(ATTENTION) if session else 0
    context = {"session": session, "csrf": csrf, "RunStatus": RunStatus,
               "attention_count": attention, **context}  # fmt: skip
    return templates.TemplateResponse(request, name, context, status_code=status)


def failure(request: Request, session: WebSession | None, exc: NightshiftError) -> Response:
    status = status_for(exc)
    message = str(exc) if status < 500 else "internal error; the server log has the details"
    return render(request, "error.html", session, status=status, message=message)


def last_event_id(request: Request) -> str | None:
    """EventSource sends Last-Event-ID when it reconnects; the first connection says where
    the rendered page left off with ?after=."""
    return request.headers.get("last-event-id") or request.query_params.get("after")
