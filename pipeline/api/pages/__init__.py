"""The status page: runs, batches and a run's timeline, and pending approvals to decide.

Server-rendered HTML (Jinja2, autoescaped), a module per page: `login` (sign in and out),
`dashboard` (the front page and what waits for a person), `runs` (a run, its live feed and its
artifacts), `batches` (a batch, its children a page at a time, its live feed), `bulk` (a bulk
operation's progress), `actions` (an action, and deciding it); `base` is what they share
(templates, the session, forms).

People sign in with their own token (`nightshift tokens create --for ...`), or are signed in by
a trusted proxy's identity header; the session is a server-side row behind a signed cookie
(HttpOnly, SameSite=Strict: pipeline/api/sessions.py) and every form, the sign-in form
included, carries a CSRF token. Decisions go through pipeline.runs.decisions.decide, the same
single-use decision as the webhook, as whom the session speaks for.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from pipeline.api.base import ApiConfig
from pipeline.api.pages import actions, batches, bulk, dashboard, login, runs
from pipeline.api.pages.base import WEB, proves_someone
from pipeline.api.sessions import Sessions, session_key
from pipeline.settings import get_settings

__all__ = ["install", "proves_someone"]


def install(app: FastAPI, config: ApiConfig) -> None:
    app.state.sessions = Sessions(session_key(config.session_secret, get_settings().data_dir))
    for page in (login, dashboard, runs, batches, bulk, actions):
        app.include_router(page.router)
    app.mount("/ui/static", StaticFiles(directory=WEB / "static"), name="static")
