"""Signing in and out: with a person's own token, by a trusted proxy's identity header, or as
nobody under --insecure-no-auth."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response

from pipeline.api import tokens
from pipeline.api.base import status_for
from pipeline.api.pages.base import (
    StaleForm,
    config,
    current_session,
    failure,
    proxied,
    read_form,
    render,
    signer,
    to_login,
)
from pipeline.api.sessions import COOKIE, LOGIN_COOKIE, LOGIN_MAX_AGE_SECONDS
from pipeline.errors import NightshiftError, Unauthenticated
from pipeline.runs.decisions import Actor

router = APIRouter(include_in_schema=False)
_NOBODY = tokens.Authenticated(Actor(tokens.ANONYMOUS, "no authentication"))
"""Who a status-page session speaks for under --insecure-no-auth."""


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=303)


@router.get("/ui/login")
def login_form(request: Request) -> Response:
    if current_session(request) is not None:
        return RedirectResponse("/ui", status_code=303)
    by_proxy = proxied(request)
    if by_proxy is not None:  # the proxy signed the person in: nothing to type
        return _signed_in(request, by_proxy)
    if config(request).insecure_no_auth:  # nobody to name: a form asking for nothing is noise
        return _signed_in(request, _NOBODY)
    return _login_page(request)


def _login_page(request: Request, refused: NightshiftError | None = None) -> Response:
    """The sign-in form (saying why the last sign-in was refused), with a fresh CSRF value in a
    cookie of its own and in the form."""
    nonce = uuid.uuid4().hex
    status = 200 if refused is None else status_for(refused)
    error = None if refused is None else str(refused)
    response = render(
        request, "login.html", None, status=status, error=error,
        insecure=config(request).insecure_no_auth,
        csrf=signer(request).login_csrf(nonce),
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
    fields = await read_form(request)
    if not signer(request).login_csrf_matches(
        request.cookies.get(LOGIN_COOKIE), fields.get("csrf")
    ):  # another site posting a token of its own would sign this browser in as that person
        return _login_page(request, StaleForm())
    api = config(request)
    token = fields.get("token", "").strip()
    found = None
    if token and api.token_matches(token):
        problem = (
            "The shared API token names nobody, and decisions here are recorded in a person's "
            "name: sign in with your own token (nightshift tokens create --for you@example.com)."
        )
    elif token:
        found = await run_in_threadpool(tokens.authenticate, token)
        problem = "That token is unknown or revoked."
    elif api.insecure_no_auth:
        found = _NOBODY
    else:
        problem = "Enter your token."
    if found is None:
        return _login_page(request, Unauthenticated(problem))
    return await run_in_threadpool(_signed_in, request, found)


def _signed_in(request: Request, found: tokens.Authenticated) -> RedirectResponse:
    """Begin a session for `found` (sync: it writes the session's row)."""
    response = RedirectResponse("/ui", status_code=303)
    via = found.actor.via.removeprefix("status page, ")
    sessions = signer(request)
    cookie = sessions.begin(found.actor.identity, f"status page, {via}", found.token_id)
    response.delete_cookie(LOGIN_COOKIE, path="/ui/login", httponly=True, samesite="strict")
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=sessions.max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    session = await run_in_threadpool(current_session, request)
    fields = await read_form(request)
    if session is not None and not signer(request).csrf_matches(session, fields.get("csrf")):
        return failure(request, session, StaleForm())
    await run_in_threadpool(signer(request).end, request.cookies.get(COOKIE))
    response = to_login()
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
