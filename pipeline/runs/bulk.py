"""Bulk operations by filter: cancel runs, retry failed ones, approve or reject pending
approvals, each exactly as the single action does (cancel.py, retry.py, decisions.py).

A dry run says what a filter matches now. The operation itself is a row (who, when, the
filter, the kind) with its items, the runs or approvals matched at creation, frozen there. A
worker applies the items one small transaction each, which marks the item done and applies
it together: a worker that dies mid-way leaves the rest, never half of one, and the tick sends
the operation again once its lease passed (a crash halfway finishes the rest, none twice).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import BulkKind
from pipeline.app import app
from pipeline.db import after_commit, read_only, transaction
from pipeline.errors import Conflict, Invalid, InvalidInput, NotFound, NothingMatched, Refused
from pipeline.logs import get_logger
from pipeline.reachability import BROKER
from pipeline.runs.bulk_filter import BulkFilter, Item, matched_txn
from pipeline.runs.cancel import cancel_run_txn
from pipeline.runs.decisions import Actor, Decision, decide_txn, wake_after_decision
from pipeline.runs.retry import retry_run_txn
from pipeline.settings import get_settings

log = get_logger("nightshift.bulk")

BULK_TASK = "pipeline.bulk"
DRY_RUN_IDS_SHOWN = 200
"""How many of the matched ids a dry run lists (the count is always whole)."""
REFUSALS = (Conflict, Invalid, NotFound, Refused)
"""What the single action answers an item it does not apply to (an approval someone else
decided, a run retention redacted, a stranger's approval): recorded as the item's outcome,
and the operation goes on."""


@dataclass(frozen=True)
class Preview:
    kind: BulkKind
    filter: BulkFilter
    items: list[Item]

    def as_json(self) -> dict[str, Any]:
        shown = self.items[:DRY_RUN_IDS_SHOWN]
        return {
            "kind": self.kind.value,
            "filter": self.filter.as_json(),
            "count": len(self.items),
            "run_ids": [str(item.run_id) for item in shown],
            "action_keys": [item.action_key for item in shown if item.action_key is not None],
            "shown": len(shown),
        }


@dataclass(frozen=True)
class Created(Preview):
    operation_id: uuid.UUID

    def as_json(self) -> dict[str, Any]:
        return {"operation_id": str(self.operation_id), **super().as_json()}


def preview(kind: BulkKind | str, wanted: BulkFilter) -> Preview:
    """The dry run: what an operation of `kind` with this filter would act on now."""
    kind = _kind(kind)
    with read_only() as session:
        return Preview(kind, wanted, matched_txn(session, kind, wanted))


def create(
    kind: BulkKind | str, wanted: BulkFilter, actor: Actor, note: str | None = None
) -> Created:
    """Record the operation with the items the filter matches now, and hand it to a worker
    once committed. Returns what it matched; `operation_id` names it."""
    kind = _kind(kind)
    operation_id = uuid.uuid4()
    with transaction() as session:
        items = matched_txn(session, kind, wanted)
        if not items:
            raise NothingMatched(f"the filter matches nothing to {kind}: no operation was made")
        statements.execute(
            session, "create_bulk_operation", id=operation_id, kind=kind.value,
            filter=statements.jsonb(wanted.as_json()), by=actor.identity, via=actor.via,
            note=note, run_ids=[item.run_id for item in items],
            action_keys=[item.action_key for item in items],
            lease=get_settings().lease_seconds,
        )  # fmt: skip
        _send_after_commit(session, [operation_id])
    log.info("bulk %s %s by %s (%s): %d item(s), filter %s", kind, operation_id,
             actor.identity, actor.via, len(items), wanted.as_json())  # fmt: skip
    return Created(kind, wanted, items, operation_id)


def _kind(kind: BulkKind | str) -> BulkKind:
    try:
        return BulkKind(kind)
    except ValueError:
        raise InvalidInput(f"bulk operation {kind!r} is none of {', '.join(BulkKind)}") from None


def process(operation_id: uuid.UUID) -> int:
    """Apply the operation's items not done yet, one transaction each; then mark it finished.
    Returns how many items this call applied. A finished operation applies nothing."""
    lease = get_settings().lease_seconds
    with transaction() as session:
        held = statements.first(session, "hold_bulk_operation", id=operation_id, lease=lease)
    if held is None:
        return 0
    kind = BulkKind(held.kind)
    # Every decision says it came from this operation, and who asked for it and how.
    actor = Actor(held.requested_by, f"bulk {operation_id}, {held.via}")
    applied = 0
    while _apply_next(operation_id, kind, actor, held.note, lease):
        applied += 1
    with transaction() as session:
        finished = statements.first(session, "finish_bulk_operation", id=operation_id)
    if finished is not None:
        log.info("bulk %s %s: finished (%d item(s) applied here)", kind, operation_id, applied)
    return applied


def _apply_next(
    operation_id: uuid.UUID, kind: BulkKind, actor: Actor, note: str | None, lease: float
) -> bool:
    """One item, in one transaction: marked done, applied, its outcome recorded. False when
    no item is left to take."""
    with transaction() as session:
        item = statements.first(session, "take_bulk_item", id=operation_id)
        if item is None:
            return False
        try:
            # A refusal raised after a write of the single action's (none does today) must
            # not take the item's mark with it: the savepoint undoes the action alone.
            with session.begin_nested():
                outcome, detail = _EFFECTS[kind](session, item, actor, note)
        except REFUSALS as exc:
            outcome, detail = "refused", str(exc)
        statements.execute(
            session, "record_bulk_item", id=operation_id, position=item.position,
            outcome=outcome, detail=detail, lease=lease,
        )  # fmt: skip
    return True


Effect = Callable[[Session, Row[Any], Actor, str | None], tuple[str, str]]


def _cancel(session: Session, item: Row[Any], actor: Actor, note: str | None) -> tuple[str, str]:
    result = cancel_run_txn(session, item.run_id, actor.identity, note or "cancelled")
    if result.ended_before:
        return "already", f"run had ended ({result.status})"
    if result.status.is_terminal():
        return "done", "cancelled"
    return "done", f"cancel requested: the run is {result.status} and stops at its next check"


def _retry(session: Session, item: Row[Any], actor: Actor, note: str | None) -> tuple[str, str]:
    started = retry_run_txn(session, item.run_id, actor.identity).started
    if started.created:
        return "done", f"retried as run {started.run_id}"
    return "already", f"retried before as run {started.run_id}"


def _decider(decision: Decision) -> Effect:
    def decide(session: Session, item: Row[Any], actor: Actor, note: str | None) -> tuple[str, str]:
        key = item.action_key
        result = decide_txn(session, key, decision, actor, note)
        if not result.first:
            return "already", f"{key}: {decision} by {result.decided_by} before"
        after_commit(session, lambda: wake_after_decision(key))
        return "done", f"{key}: {result.state}"

    return decide


_EFFECTS: dict[BulkKind, Effect] = {
    BulkKind.CANCEL: _cancel,
    BulkKind.RETRY: _retry,
    BulkKind.APPROVE: _decider(Decision.APPROVE),
    BulkKind.REJECT: _decider(Decision.REJECT),
}


def resend_lost_txn(session: Session, limit: int) -> list[uuid.UUID]:
    """The tick: operations whose worker died (or whose task was lost) are sent again."""
    lease = get_settings().lease_seconds
    rows = statements.rows(session, "take_lost_bulk_operations", lease=lease, limit=limit)
    lost = [row.id for row in rows]
    _send_after_commit(session, lost)
    return lost


def _send_after_commit(session: Session, operation_ids: list[uuid.UUID]) -> None:
    if not operation_ids:
        return
    queue = get_settings().control_queue

    def send() -> None:
        try:
            for operation_id in operation_ids:
                app.send_task(BULK_TASK, args=[str(operation_id)], queue=queue,
                              ignore_result=True)  # fmt: skip
        except Exception as exc:  # committed: the tick sends it once its lease passed
            if not BROKER.is_outage(exc):
                raise
            BROKER.failed(exc)

    after_commit(session, send)
