"""Budgets, checked before every model and tool call: per run (tool calls, tokens, money), per
batch (tokens, money, tool calls) and per night across every batch of the night (money, with a
warning first). Exceeding one stops the run, the rest of the batch or every batch of the night,
with the reason recorded, and raises one alert (a row, a log line, an optional webhook).

Money is the runs' recorded cost (each model call priced for its model, cache writes and reads
at their own prices), so a budget and the cost a person reads are the same number. The calls
other runs have in flight are not counted until their step commits."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
from sqlalchemy import Date, DateTime, bindparam, cast, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from models import Alert, Batch, BatchStatus, Run, RunStatus, tokens_used
from pipeline.logs import get_logger
from pipeline.runs.obligations import settle_actions_of_ended_txn
from pipeline.settings import Settings

log = get_logger("nightshift.budgets")

NIGHT_STARTS = timedelta(hours=12)
"""A night runs from noon to noon in NIGHTSHIFT_NIGHT_TIMEZONE and is named by its first day."""
NIGHT_WARNING = "nightly_budget_warning"
NIGHT_STOPPED = "nightly_budget"


@dataclass(frozen=True)
class NewAlert:
    kind: str
    subject: str
    message: str


@dataclass(frozen=True)
class Night:
    """The spend of every batch of the run's batch's night."""

    name: str
    """The night's first day, `2026-11-29`."""
    cost_usd: float
    warned: bool
    """Whether the warning alert was raised already."""

    @property
    def subject(self) -> str:
        return f"night:{self.name}"


@dataclass(frozen=True)
class Spend:
    """What a run and its batch have used so far, as the database says now."""

    tool_calls: int
    tokens: int
    cost_usd: float
    batch_id: str | None
    batch_status: BatchStatus | None
    batch_stop_reason: str | None
    batch_token_cap: int | None
    batch_cost_cap: float | None
    batch_tool_call_cap: int | None
    batch_tokens: int = 0
    batch_cost_usd: float = 0.0
    batch_tool_calls: int = 0
    night: Night | None = None
    """Read only when a nightly cap is configured and the run belongs to a batch."""


_RUNS, _BATCHES = Run.__table__.c, Batch.__table__.c

SPEND_COLUMNS = (
    _RUNS.tool_calls,
    tokens_used(_RUNS).label("tokens"),
    _RUNS.cost_usd,
    _RUNS.batch_id,
    _BATCHES.status.label("batch_status"),
    _BATCHES.stop_reason.label("batch_stop_reason"),
    _BATCHES.token_cap,
    _BATCHES.cost_cap_usd,
    _BATCHES.tool_call_cap,
    _BATCHES.created_at.label("batch_created_at"),
)
"""What a spend check reads of a run and its batch: select them from RUN_AND_BATCH (plain Core
statements built once: the ORM's per-call statement building was a third of a step's CPU)."""
RUN_AND_BATCH = Run.__table__.outerjoin(Batch.__table__, _BATCHES.id == _RUNS.batch_id)

_BATCH_SPEND = select(
    func.coalesce(func.sum(tokens_used(_RUNS)), 0),
    func.coalesce(func.sum(_RUNS.cost_usd), 0),
    func.coalesce(func.sum(_RUNS.tool_calls), 0),
).where(_RUNS.batch_id == bindparam("batch_id"))


def spend_of(session: Session, row: Any, settings: Settings) -> Spend:
    """The spend from a row of SPEND_COLUMNS, and the batch's and the night's if it has one."""
    spend = Spend(
        tool_calls=row.tool_calls,
        tokens=row.tokens,
        cost_usd=float(row.cost_usd),
        batch_id=row.batch_id,
        batch_status=row.batch_status,
        batch_stop_reason=row.batch_stop_reason,
        batch_token_cap=row.token_cap,
        batch_cost_cap=float(row.cost_cap_usd) if row.cost_cap_usd is not None else None,
        batch_tool_call_cap=row.tool_call_cap,
    )
    if row.batch_id is None:
        return spend
    tokens, cost, calls = session.execute(_BATCH_SPEND, {"batch_id": row.batch_id}).one()
    night = None
    if settings.nightly_cost_cap_usd is not None:
        night = _night_txn(session, settings, night_of(settings, row.batch_created_at))
    return replace(
        spend,
        batch_tokens=int(tokens),
        batch_cost_usd=float(cost),
        batch_tool_calls=int(calls),
        night=night,
    )


def night_of(settings: Settings, created_at: datetime) -> date:
    """The night (named by its first day) a batch created at `created_at` belongs to."""
    return (created_at.astimezone(ZoneInfo(settings.night_timezone)) - NIGHT_STARTS).date()


def _in_night(settings: Settings, night: date) -> ColumnElement[bool]:
    """Batches of that night, in SQL (the same arithmetic as night_of)."""
    local = func.timezone(settings.night_timezone, Batch.created_at, type_=DateTime())
    return cast(local - NIGHT_STARTS, Date) == night


def _night_txn(session: Session, settings: Settings, night: date) -> Night:
    cost = session.scalar(
        select(func.coalesce(func.sum(Run.cost_usd), 0))
        .join(Batch, Batch.id == Run.batch_id)
        .where(_in_night(settings, night))
    )
    name = night.isoformat()
    warned = session.scalar(
        select(Alert.id).where(Alert.kind == NIGHT_WARNING, Alert.subject == f"night:{name}")
    )
    return Night(name, float(cost or 0), warned is not None)


def batch_over_budget(spend: Spend, calls_in_step: int, before_tool: bool) -> str | None:
    """Why the batch must stop, or None."""
    if spend.batch_token_cap is not None and spend.batch_tokens >= spend.batch_token_cap:
        return (
            f"batch {spend.batch_id} used {spend.batch_tokens} tokens; "
            f"its cap is {spend.batch_token_cap}"
        )
    if spend.batch_cost_cap is not None and spend.batch_cost_usd >= spend.batch_cost_cap:
        return (
            f"batch {spend.batch_id} cost ${spend.batch_cost_usd:.4f}; "
            f"its cap is ${spend.batch_cost_cap:.2f}"
        )
    calls = spend.batch_tool_calls + calls_in_step
    cap = spend.batch_tool_call_cap
    if before_tool and cap is not None and calls >= cap:
        return f"batch {spend.batch_id} made {calls} tool calls; its cap is {cap}"
    return None


def night_over_budget(spend: Spend, settings: Settings) -> str | None:
    cap = settings.nightly_cost_cap_usd
    if spend.night is None or cap is None or spend.night.cost_usd < cap:
        return None
    return f"the batches of the night of {spend.night.name} cost ${spend.night.cost_usd:.4f}; "\
        f"the nightly cap is ${cap:.2f}"  # fmt: skip


def night_warning(spend: Spend, settings: Settings) -> str | None:
    """The warning to raise (once) when the night's spend nears the cap, or None."""
    cap, night = settings.nightly_cost_cap_usd, spend.night
    if night is None or cap is None or night.warned:
        return None
    if night.cost_usd < cap * settings.nightly_alert_fraction:
        return None
    return (
        f"the batches of the night of {night.name} cost ${night.cost_usd:.4f}, "
        f"{night.cost_usd / cap:.0%} of the nightly cap of ${cap:.2f}"
    )


def stop_batch_txn(session: Session, batch_id: str, reason: str, message: str) -> NewAlert | None:
    """Stop the rest of the batch: running children see it at their next check, parked ones
    are cancelled here. Returns the alert if this call was the one that raised it."""
    _stop_batches_txn(session, Batch.id == batch_id, reason, message)
    return raise_alert_txn(session, f"budget_{reason}", f"batch:{batch_id}", message)


def stop_night_txn(
    session: Session, settings: Settings, night: Night, message: str
) -> NewAlert | None:
    """Stop every running batch of the night, with one alert for the night."""
    in_night = _in_night(settings, date.fromisoformat(night.name))
    _stop_batches_txn(session, in_night, NIGHT_STOPPED, message)
    return raise_alert_txn(session, NIGHT_STOPPED, night.subject, message)


def _stop_batches_txn(
    session: Session, which: ColumnElement[bool], reason: str, message: str
) -> None:
    stopped = session.scalars(
        update(Batch)
        .where(which, Batch.status == BatchStatus.RUNNING)
        .values(status=BatchStatus.STOPPED, stop_reason=reason, finished_at=func.now())
        .returning(Batch.id)
    ).all()
    if not stopped:
        return
    parked = session.scalars(
        update(Run)
        .where(Run.batch_id.in_(stopped), Run.status.in_(RunStatus.parked()))
        .values(
            status=RunStatus.FAILED,
            stop_reason=reason,
            finished_at=func.now(),
            wake_at=None,
            error=message,
        )
        .returning(Run.id)
    ).all()
    settle_actions_of_ended_txn(session, parked, reason)


def raise_alert_txn(session: Session, kind: str, subject: str, message: str) -> NewAlert | None:
    """One alert per kind and subject, however many runs trip it."""
    created = session.execute(
        insert(Alert)
        .values(kind=kind, subject=subject, message=message)
        .on_conflict_do_nothing(index_elements=["kind", "subject"])
        .returning(Alert.id)
    ).scalar_one_or_none()
    if created is None:
        return None
    log.warning("ALERT %s on %s: %s", kind, subject, message)
    return NewAlert(kind, subject, message)


def notify(alert: NewAlert, settings: Settings) -> None:
    """Best effort, after the commit: the alert row is the record either way."""
    if not settings.alert_webhook_url:
        return
    body: dict[str, Any] = {"kind": alert.kind, "subject": alert.subject, "message": alert.message}
    try:
        httpx.post(settings.alert_webhook_url, json=body, timeout=5.0).raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("alert %s on %s: the webhook failed: %s", alert.kind, alert.subject, exc)
