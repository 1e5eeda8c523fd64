"""An action's page, and deciding it in the signed-in person's name: approve or reject, say
what happened to a send whose outcome nobody knows, or retry a failed action."""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response

from pipeline.api.base import status_for
from pipeline.api.pages.base import (
    StaleForm,
    current_session,
    failure,
    read_form,
    render,
    signer,
    to_login,
)
from pipeline.api.words import as_seen_by
from pipeline.errors import Invalid, NightshiftError
from pipeline.runs.decisions import Actor, Decision, Seen, decide, retry
from pipeline.views.actions import show_action

MAX_NOTE = 2000

router = APIRouter(include_in_schema=False)


@router.get("/ui/actions/{key:path}")
def action_page(
    request: Request, key: str, repeated: int = 0, decided: str | None = None
) -> Response:
    session = current_session(request)
    if session is None:
        return to_login()
    try:
        action = as_seen_by(show_action(key), session.who)
    except NightshiftError as exc:
        return failure(request, session, exc)
    return render(
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
    session = await run_in_threadpool(current_session, request)
    if session is None:
        return to_login()
    fields = await read_form(request)
    if not signer(request).csrf_matches(session, fields.get("csrf")):
        return failure(request, session, StaleForm())
    decision = fields.get("decision")
    if decision not in _PAGE_DECISIONS:
        message = f"decision must be one of {', '.join(_PAGE_DECISIONS)}"
        return failure(request, session, Invalid(message))
    note = (fields.get("note") or "").strip()[:MAX_NOTE] or None
    actor = Actor(session.who, session.via)
    try:
        if decision == "retry":
            await run_in_threadpool(retry, key, actor, note)
            return RedirectResponse(f"/ui/actions/{quote(key, safe='')}?decided=retry", 303)
        seen = _seen(fields, decision)
        result = await run_in_threadpool(decide, key, decision, actor, note, seen)
    except NightshiftError as exc:
        try:
            action = as_seen_by(await run_in_threadpool(show_action, key), session.who)
        except NightshiftError:
            return failure(request, session, exc)
        return render(
            request, "action.html", session, status=status_for(exc), action=action,
            error=str(exc), repeated=False,
        )  # fmt: skip
    target = f"/ui/actions/{quote(key, safe='')}"
    shown = f"?decided={result.decision.value}" if result.first else "?repeated=1"
    return RedirectResponse(target + shown, status_code=303)


_PAGE_DECISIONS = ("approve", "reject", "happened", "did_not_happen", "retry")


_HASH = re.compile("^[0-9a-f]{64}$")


def _seen(fields: dict[str, str], decision: str) -> Seen:
    """The run and arguments the form showed. An approval or a rejection must name both, as
    the webhook's must: a form without them (forged, or from a page older than them) would
    decide whatever the key holds now."""
    run_id, args_hash = fields.get("run_id") or "", fields.get("args_hash") or ""
    if decision in (Decision.APPROVE, Decision.REJECT) and not (run_id and args_hash):
        raise Invalid(
            f"{decision} needs the run ('run_id') and the arguments' hash ('args_hash') the "
            "action's page showed; reload the page and decide again"
        )
    try:
        seen_run = uuid.UUID(run_id) if run_id else None
    except ValueError:
        raise Invalid("the form's run_id is not a run id") from None
    if args_hash and not _HASH.match(args_hash):
        raise Invalid("the form's args_hash is not a SHA-256 hash")
    return Seen(seen_run, args_hash or None)
