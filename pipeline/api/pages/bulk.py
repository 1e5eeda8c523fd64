"""A bulk operation's page: who asked for what, by which filter, how far it got and what each
item came to; it refreshes itself until a worker finished the operation."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from pipeline.api.pages.base import current_session, failure, render, to_login
from pipeline.errors import NightshiftError
from pipeline.views.bulk import bulk_operation, parse_operation_id

router = APIRouter(include_in_schema=False)


@router.get("/ui/bulk/{operation_id}")
def bulk_page(request: Request, operation_id: str) -> Response:
    session = current_session(request)
    if session is None:
        return to_login()
    try:
        operation = bulk_operation(parse_operation_id(operation_id))
    except NightshiftError as exc:
        return failure(request, session, exc)
    return render(request, "bulk.html", session, operation=operation)
