"""What a bulk operation acts on: the runs a filter matches (agent, batch, status, stop reason,
started between, waiting on), narrowed to those the operation applies to; for decisions, the
pending approvals of those runs. The dry run and the operation match by this one query."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, String, and_, cast, exists, literal, null, select
from sqlalchemy.orm import Session, aliased

from models import Action, ActionState, BulkKind, Run, RunStatus
from pipeline.errors import InvalidInput
from pipeline.keys import RETRY_PREFIX, WaitKind
from pipeline.runs.retry import RETRYABLE

MAX_ITEMS = 10_000
"""The most runs (or approvals) one operation takes: a larger night is several operations,
each of which a person looked at in its dry run."""


@dataclass(frozen=True)
class BulkFilter:
    """Runs whose every given field matches; at least one is needed (no operation on
    everything by omission)."""

    agent: str | None = None
    batch: str | None = None
    status: RunStatus | None = None
    stop_reason: str | None = None
    started_after: datetime | None = None
    """Created at or after this time."""
    started_before: datetime | None = None
    """Created before this time."""
    waiting_on: WaitKind | None = None
    """Runs waiting on this kind of wait (`approval`: for a person's approval of an action)."""

    @classmethod
    def parse(cls, given: Mapping[str, Any]) -> BulkFilter:
        """From JSON or command-line values (strings); InvalidInput names what is wrong."""
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise InvalidInput(
                f"filter has no field {unknown[0]!r} (it has {', '.join(sorted(known))})"
            )
        values = {name: value for name, value in given.items() if value not in (None, "")}
        if not values:
            raise InvalidInput(
                f"a bulk operation needs a filter: at least one of {', '.join(sorted(known))}"
            )
        for name, value in values.items():
            if not isinstance(value, str) or len(value) > 200:
                raise InvalidInput(f"filter field {name!r} must be a string of up to 200 chars")
        return cls(
            agent=values.get("agent"),
            batch=values.get("batch"),
            status=_status(values.get("status")),
            stop_reason=values.get("stop_reason"),
            started_after=_instant(values.get("started_after"), "started_after"),
            started_before=_instant(values.get("started_before"), "started_before"),
            waiting_on=_wait(values.get("waiting_on")),
        )

    def as_json(self) -> dict[str, str]:
        """The fields given, as the operation records them."""
        shown = {}
        for name, value in asdict(self).items():
            if value is not None:
                shown[name] = value.isoformat() if isinstance(value, datetime) else str(value)
        return shown


def _status(value: str | None) -> RunStatus | None:
    if value is None:
        return None
    try:
        return RunStatus(value)
    except ValueError:
        raise InvalidInput(
            f"filter status {value!r} is not a run status ({', '.join(RunStatus)})"
        ) from None


def _instant(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"filter {name} {value[:40]!r} is not an ISO-8601 time") from None
    if instant.tzinfo is None:
        raise InvalidInput(f"filter {name} {value!r} needs a timezone (e.g. +00:00 or Z)")
    return instant


def _wait(value: str | None) -> WaitKind | None:
    if value is None:
        return None
    try:
        return WaitKind(value)
    except ValueError:
        raise InvalidInput(
            f"filter waiting_on {value[:40]!r} is no kind of wait ({', '.join(WaitKind)})"
        ) from None


@dataclass(frozen=True)
class Item:
    run_id: uuid.UUID
    action_key: str | None = None
    """The pending approval to decide (approve, reject)."""


def matched_txn(session: Session, kind: BulkKind, wanted: BulkFilter) -> list[Item]:
    """What an operation of `kind` would act on now, oldest run first; InvalidInput when it
    is more than MAX_ITEMS."""
    query = _items(kind, wanted).limit(MAX_ITEMS + 1)
    items = [Item(row.id, row.action_key) for row in session.execute(query)]
    if len(items) > MAX_ITEMS:
        what = "approvals" if kind.on_actions() else "runs"
        raise InvalidInput(
            f"the filter matches more than {MAX_ITEMS} {what} for one operation: narrow it "
            "(a batch, an agent, started_after/started_before)"
        )
    return items


def _items(kind: BulkKind, wanted: BulkFilter) -> Select[Any, Any]:
    runs = _runs(wanted)
    if kind.on_actions():
        # Its pending approvals: a run waits for one at a time, but may have asked for several.
        return (
            select(Run.id, Action.idempotency_key.label("action_key"))
            .join(Action, Action.run_id == Run.id)
            .where(runs, Action.state == ActionState.PENDING_APPROVAL)
            .order_by(Run.created_at, Run.id, Action.created_at)
        )
    applies: ColumnElement[bool]
    if kind is BulkKind.CANCEL:
        applies = Run.status.not_in(RunStatus.terminal())
    else:  # retry: ended badly, and not retried yet (a retry of a retry is a run of its own)
        retried = aliased(Run)
        applies = and_(
            Run.status.in_(RETRYABLE),
            ~exists().where(
                retried.idempotency_key == literal(RETRY_PREFIX) + cast(Run.id, String)
            ),
        )
    return (
        select(Run.id, null().label("action_key"))
        .where(runs, applies)
        .order_by(Run.created_at, Run.id)
    )


def _runs(wanted: BulkFilter) -> ColumnElement[bool]:
    """The filter as a condition on runs."""
    conditions: list[ColumnElement[bool]] = []
    if wanted.agent is not None:
        conditions.append(Run.agent == wanted.agent)
    if wanted.batch is not None:
        conditions.append(Run.batch_id == wanted.batch)
    if wanted.status is not None:
        conditions.append(Run.status == wanted.status)
    if wanted.stop_reason is not None:
        conditions.append(Run.stop_reason == wanted.stop_reason)
    if wanted.started_after is not None:
        conditions.append(Run.created_at >= wanted.started_after)
    if wanted.started_before is not None:
        conditions.append(Run.created_at < wanted.started_before)
    if wanted.waiting_on is not None:  # `kind:` and anything (a kind has no LIKE wildcard)
        conditions.append(Run.waiting_on.startswith(f"{wanted.waiting_on}:"))
    return and_(*conditions)
