"""Budgets, checked before every model and tool call: per run (tool calls, tokens) and per
batch (tokens, an estimate of money). Exceeding one stops the run, or the rest of the batch,
with the reason recorded, and raises one alert (a row, a log line, an optional webhook)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import Alert, Batch, BatchStatus, Run, RunStatus
from pipeline.logs import get_logger
from pipeline.settings import Settings

log = get_logger("nightshift.budgets")


@dataclass(frozen=True)
class NewAlert:
    kind: str
    subject: str
    message: str


@dataclass(frozen=True)
class Spend:
    """What a run and its batch have used so far, as the database says now."""

    tool_calls: int
    tokens: int
    batch_id: str | None
    batch_status: BatchStatus | None
    batch_stop_reason: str | None
    batch_token_cap: int | None
    batch_cost_cap: float | None
    batch_input_tokens: int
    batch_output_tokens: int


def cost_usd(settings: Settings, input_tokens: int, output_tokens: int) -> float:
    return (
        input_tokens * settings.price_input_per_mtok
        + output_tokens * settings.price_output_per_mtok
    ) / 1_000_000


def spend_txn(session: Session, run_id: uuid.UUID) -> Spend:
    row = session.execute(
        select(
            Run.tool_calls,
            (Run.input_tokens + Run.output_tokens).label("tokens"),
            Run.batch_id,
            Batch.status,
            Batch.stop_reason,
            Batch.token_cap,
            Batch.cost_cap_usd,
        )
        .outerjoin(Batch, Batch.id == Run.batch_id)
        .where(Run.id == run_id)
    ).one()
    batch_in = batch_out = 0
    if row.batch_id is not None:
        usage = session.execute(
            select(
                func.coalesce(func.sum(Run.input_tokens), 0),
                func.coalesce(func.sum(Run.output_tokens), 0),
            ).where(Run.batch_id == row.batch_id)
        ).one()
        batch_in, batch_out = int(usage[0]), int(usage[1])
    return Spend(
        tool_calls=row.tool_calls,
        tokens=row.tokens,
        batch_id=row.batch_id,
        batch_status=row.status,
        batch_stop_reason=row.stop_reason,
        batch_token_cap=row.token_cap,
        batch_cost_cap=float(row.cost_cap_usd) if row.cost_cap_usd is not None else None,
        batch_input_tokens=batch_in,
        batch_output_tokens=batch_out,
    )


def batch_over_budget(spend: Spend, settings: Settings) -> str | None:
    """Why the batch must stop, or None."""
    tokens = spend.batch_input_tokens + spend.batch_output_tokens
    if spend.batch_token_cap is not None and tokens >= spend.batch_token_cap:
        return f"batch {spend.batch_id} used {tokens} tokens; its cap is {spend.batch_token_cap}"
    cost = cost_usd(settings, spend.batch_input_tokens, spend.batch_output_tokens)
    if spend.batch_cost_cap is not None and cost >= spend.batch_cost_cap:
        return (
            f"batch {spend.batch_id} cost about ${cost:.2f}; its cap is ${spend.batch_cost_cap:.2f}"
        )
    return None


def stop_batch_txn(session: Session, batch_id: str, reason: str, message: str) -> NewAlert | None:
    """Stop the rest of the batch: running children see it at their next check, parked ones
    are cancelled here. Returns the alert if this call was the one that raised it."""
    session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.status == BatchStatus.RUNNING)
        .values(status=BatchStatus.STOPPED, stop_reason=reason, finished_at=func.now())
    )
    session.execute(
        update(Run)
        .where(Run.batch_id == batch_id, Run.status.in_(RunStatus.parked()))
        .values(
            status=RunStatus.FAILED,
            stop_reason=reason,
            finished_at=func.now(),
            wake_at=None,
            error=message,
        )
    )
    return raise_alert_txn(session, f"budget_{reason}", f"batch:{batch_id}", message)


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
