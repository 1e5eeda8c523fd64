"""Budgets, checked before every model and tool call: per run (tool calls, tokens, money), per
batch (tokens, money, tool calls) and per night across every run of the night, whatever started
it (tokens and/or money, with a warning first). Exceeding one stops the run, the rest of the
batch or every batch of the night (and each other run of the night at its next check, but the
partial synthesis of a batch the night stopped), with the reason recorded, and raises one
alert: a row, a log line and, if NIGHTSHIFT_ALERT_WEBHOOK_URL is set, a webhook delivered like
a completion webhook (pipeline/delivery/sender.py).

Money is the runs' recorded cost (each model call priced for its model, cache writes and reads
at their own prices), so a budget and the cost a person reads are the same number. The calls
other runs have in flight are not counted until their step commits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import BatchStatus
from pipeline.logs import get_logger
from pipeline.runs import fanout, notifications
from pipeline.runs.obligations import settle_actions_of_ended_txn
from pipeline.settings import Settings

log = get_logger("nightshift.budgets")

ONE_DAY = timedelta(days=1)
"""A night runs from noon to noon in NIGHTSHIFT_NIGHT_TIMEZONE and is named by its first day
(step.sql's `limits` statement finds a run's night the same way)."""
NIGHT_WARNING = "nightly_budget_warning"
NIGHT_STOPPED = fanout.NIGHTLY_CAP
BATCH_STOPPED = fanout.BATCH_CAP


@dataclass(frozen=True)
class NewAlert:
    kind: str
    subject: str
    message: str


@dataclass(frozen=True)
class Night:
    """The spend of every run of the run's night (batches, schedules, `.delay()`, API, events)."""

    name: str
    """The night's first day, `2026-11-29`."""
    cost_usd: float
    tokens: int
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
    """Read only when a nightly cap is configured."""
    sums_up_stopped_night: bool = False
    """The run is the partial synthesis of a batch the nightly cap stopped: the one run of the
    night let past the cap, so that the night still ends with a summary of what finished."""


def spend_of(values: Mapping[str, Any]) -> Spend:
    """The spend as schema.sql's nightshift_limits reads it (it sums the batch's and the
    night's only when they have a cap)."""
    night = None
    if values["night"] is not None:
        night = Night(
            values["night"],
            float(values["night_cost_usd"]),
            int(values["night_tokens"]),
            values["night_warned"],
        )
    status = values["batch_status"]
    return Spend(
        tool_calls=values["tool_calls"],
        tokens=values["tokens"],
        cost_usd=float(values["cost_usd"]),
        batch_id=values["batch_id"],
        batch_status=BatchStatus(status) if status is not None else None,
        batch_stop_reason=values["batch_stop_reason"],
        batch_token_cap=values["batch_token_cap"],
        batch_cost_cap=_money(values["batch_cost_cap"]),
        batch_tool_call_cap=values["batch_tool_call_cap"],
        batch_tokens=int(values["batch_tokens"] or 0),
        batch_cost_usd=float(values["batch_cost_usd"] or 0),
        batch_tool_calls=int(values["batch_tool_calls"] or 0),
        night=night,
        sums_up_stopped_night=bool(values["sums_up_stopped_night"]),
    )


def _money(value: Any) -> float | None:
    return float(value) if value is not None else None


def night_window(settings: Settings, night: date) -> tuple[datetime, datetime]:
    """When the night starts and ends: noon to noon, local time (23 or 25 hours across a
    daylight-saving change)."""
    zone = ZoneInfo(settings.night_timezone)
    noon = time(12)
    return datetime.combine(night, noon, zone), datetime.combine(night + ONE_DAY, noon, zone)


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


def _night_shares(night: Night, settings: Settings) -> list[tuple[float, str, str]]:
    """(share of its cap, what was used, the cap) for each nightly cap that is set."""
    shares = []
    if settings.nightly_token_cap is not None:
        cap = settings.nightly_token_cap
        shares.append((night.tokens / cap, f"used {night.tokens} tokens", f"token cap {cap}"))
    if settings.nightly_cost_cap_usd is not None:
        money = settings.nightly_cost_cap_usd
        used = f"cost ${night.cost_usd:.4f}"
        shares.append((night.cost_usd / money, used, f"cap ${money:.2f}"))
    return shares


def night_over_budget(spend: Spend, settings: Settings) -> str | None:
    """Why every run of the night must stop, or None."""
    if spend.night is None or spend.sums_up_stopped_night:
        return None
    over = [
        f"{used}; the nightly {cap.replace('cap ', 'cap is ')}"
        for share, used, cap in _night_shares(spend.night, settings)
        if share >= 1
    ]
    if not over:
        return None
    return f"the runs of the night of {spend.night.name} " + " and ".join(over)


def night_warning(spend: Spend, settings: Settings) -> str | None:
    """The warning to raise (once) when the night's spend nears a nightly cap, or None."""
    night = spend.night
    if night is None or night.warned:
        return None
    near = [
        f"{used}, {share:.0%} of the nightly {cap.replace('cap ', 'cap of ')}"
        for share, used, cap in _night_shares(night, settings)
        if share >= settings.nightly_alert_fraction
    ]
    if not near:
        return None
    return f"the runs of the night of {night.name} " + " and ".join(near)


def stop_batch_txn(
    session: Session, settings: Settings, batch_id: str, reason: str, message: str
) -> NewAlert | None:
    """Stop the rest of the batch: running children see it at their next check, parked ones
    are cancelled here. Returns the alert if this call was the one that raised it."""
    stopped = statements.rows(session, "stop_batch", batch_id=batch_id, reason=reason)
    _fail_parked_children_txn(session, [row.id for row in stopped], reason, message)
    return raise_alert_txn(session, settings, f"budget_{reason}", f"batch:{batch_id}", message)


def stop_night_txn(
    session: Session, settings: Settings, night: Night, message: str
) -> NewAlert | None:
    """Stop every running batch of the night, with one alert for the night."""
    starts, ends = night_window(settings, date.fromisoformat(night.name))
    stopped = statements.rows(
        session, "stop_night_batches", starts=starts, ends=ends, reason=NIGHT_STOPPED
    )
    _fail_parked_children_txn(session, [row.id for row in stopped], NIGHT_STOPPED, message)
    return raise_alert_txn(session, settings, NIGHT_STOPPED, night.subject, message)


def _fail_parked_children_txn(
    session: Session, batch_ids: list[str], reason: str, message: str
) -> None:
    """The stopped batches' parked children end here; the running ones at their next check."""
    if not batch_ids:
        return
    parked = statements.rows(
        session, "fail_parked_children", batch_ids=batch_ids, reason=reason, message=message
    )
    settle_actions_of_ended_txn(session, [row.id for row in parked], reason)


def raise_alert_txn(
    session: Session, settings: Settings, kind: str, subject: str, message: str
) -> NewAlert | None:
    """One alert per kind and subject, however many runs trip it; and, if
    NIGHTSHIFT_ALERT_WEBHOOK_URL is set, its delivery owed, in the same transaction (the
    caller's, fenced): sent after the commit like a completion webhook, retried, once per key."""
    row = statements.first(session, "raise_alert", kind=kind, subject=subject, message=message)
    if row is None:
        return None
    created: int = row.id
    log.warning("ALERT %s on %s: %s", kind, subject, message)
    if settings.alert_webhook_url:
        notifications.owe_alert_txn(session, created, subject, settings.alert_webhook_url)
        notifications.dispatch_new_txn(session)
    return NewAlert(kind, subject, message)
