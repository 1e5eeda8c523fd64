"""A run's page (its timeline, step by step), its live feed, and its artifacts to read."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from pipeline.api.pages.base import (
    current_session,
    failure,
    last_event_id,
    render,
    signed_in,
    to_login,
)
from pipeline.api.sse import event_stream
from pipeline.errors import NightshiftError, Unauthenticated
from pipeline.keys import entry_kind
from pipeline.settings import get_settings
from pipeline.views.artifacts import read_artifact
from pipeline.views.feed import Subject, format_position, latest_position
from pipeline.views.liveness import queue_liveness, stall
from pipeline.views.runs import resolve_run_id, show_run

router = APIRouter(include_in_schema=False)


@router.get("/ui/runs/{run_id}")
def run_page(request: Request, run_id: str) -> Response:
    session = current_session(request)
    if session is None:
        return to_login()
    try:
        wanted = resolve_run_id(run_id)
        # Before reading the run: whatever commits from here on arrives as an event (the
        # page drops what it already shows), so nothing falls between the two.
        after = format_position(latest_position())
        detail = show_run(wanted, full=True)
    except NightshiftError as exc:
        return failure(request, session, exc)
    run = detail["run"]
    updated = datetime.fromisoformat(run["updated_at"])
    stalled = stall(run["status"], run["lease_owner"], updated, queue_liveness(), get_settings())
    return render(
        request, "run.html", session, steps=_timeline(detail["journal"]), stalled=stalled,
        after=after, **detail,
    )  # fmt: skip


@router.get("/ui/runs/{run_id}/events")
async def run_feed(request: Request, run_id: str) -> Response:
    """The run page's live feed: the API's event stream, behind the page's session."""
    if current_session(request) is None:
        raise Unauthenticated("sign in first (/ui/login)")
    subject = Subject(run_id=await run_in_threadpool(resolve_run_id, run_id))
    return await event_stream(subject, last_event_id(request), lambda: signed_in(request))


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
    session = current_session(request)
    if session is None:
        return to_login()
    try:
        run = resolve_run_id(run_id)
        artifact = read_artifact(run, artifact_id)
    except NightshiftError as exc:
        return failure(request, session, exc)
    return render(request, "artifact.html", session, artifact=artifact, run_id=str(run))
