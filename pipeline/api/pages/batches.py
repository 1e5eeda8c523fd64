"""A batch's page: its counts by status and its children a page at a time, kept current by
its live feed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
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
from pipeline.errors import NightshiftError, NotFound, Unauthenticated
from pipeline.views.batches import item_labels, show_batch
from pipeline.views.feed import Subject, format_position, latest_position
from pipeline.views.runs import list_runs

CHILDREN_A_PAGE = 100
"""A batch's page lists its children this many at a time, under their counts by status."""

router = APIRouter(include_in_schema=False)


# The batch page's own error (only this page raises it), so it stays at this edge.
class NoSuchPage(NotFound):
    """The batch's children end before the page asked for."""


# The batch id is a path, so the routes under it come before the page's own.


@router.get("/ui/batches/{batch_id:path}/events")
async def batch_feed(request: Request, batch_id: str) -> Response:
    if current_session(request) is None:
        raise Unauthenticated("sign in first (/ui/login)")
    subject = Subject(batch_id=batch_id)
    return await event_stream(subject, last_event_id(request), lambda: signed_in(request))


@router.get("/ui/batches/{batch_id:path}/progress")
def batch_progress(request: Request, batch_id: str) -> dict[str, Any]:
    """The batch as GET /batches/{id} shows it: what its page's counts follow, since the page
    lists only a page of the children."""
    if current_session(request) is None:
        raise Unauthenticated("sign in first (/ui/login)")
    return show_batch(batch_id).as_json()


@router.get("/ui/batches/{batch_id:path}")
def batch_page(request: Request, batch_id: str, page: int = 1) -> Response:
    session = current_session(request)
    if session is None:
        return to_login()
    try:
        after = format_position(latest_position())
        batch = show_batch(batch_id).as_json()
    except NightshiftError as exc:
        return failure(request, session, exc)
    total = batch["children"]["total"]
    last_page = max(1, -(-total // CHILDREN_A_PAGE))
    if not 1 <= page <= last_page:
        return failure(request, session, NoSuchPage(
            f"batch {batch_id} has {last_page} page(s) of children ({CHILDREN_A_PAGE} a "
            f"page); there is no page {page}"
        ))  # fmt: skip
    first = (page - 1) * CHILDREN_A_PAGE
    runs = list_runs(batch=batch_id, limit=CHILDREN_A_PAGE, offset=first)
    pages = {
        "first": first + 1 if runs else first,
        "last": first + len(runs),
        "total": total,
        "newer": page - 1 if page > 1 else None,
        "older": page + 1 if first + len(runs) < total else None,
    }
    items = item_labels(batch_id, [run["id"] for run in runs])
    return render(
        request, "batch.html", session, batch=batch, runs=runs, pages=pages, after=after,
        items=items,
    )  # fmt: skip
