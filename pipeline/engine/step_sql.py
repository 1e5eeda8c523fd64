"""The statements every step runs (models/sql/step.sql, by name), sent through
pipeline/statements.py `pipelined`: each transaction one statement, one round trip to
PostgreSQL: the claim with everything the step loads, the model reply with the limits read
after it, a tool result that is not the step's last, and the checkpoint (a statement's driver
work is most of a step's CPU: five statements pipelined cost about five times one). Lease
renewals, one statement a process, run here too.

Every write carries the fence; a step whose fence is gone writes nothing, and learns it from
the row that did not come back (the callers raise LeaseLost)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from pipeline.engine.budgets import NIGHT_STOPPED, NIGHT_WARNING
from pipeline.engine.journal import Entry
from pipeline.settings import Settings
from pipeline.statements import jsonb, pipelined


@dataclass(frozen=True)
class Claimed:
    """What a claim took and loaded, in its one transaction."""

    fence: int
    taken_from: str | None
    """The holder whose attempt failed (its lease lapsed, or its process is gone)."""
    resumed: tuple[str, float] | None
    """(cause, seconds the run stood still) when the claim picked up a run that had stopped."""
    run: Any
    """The run's columns a step reads, as attributes (schema.sql's nightshift_claim `run`)."""
    limits: Mapping[str, Any]
    """schema.sql's nightshift_limits."""
    entries: list[Any]
    """The journal entries read (id, key, step, step_name, payload), as attributes."""


@dataclass(frozen=True)
class NotClaimed:
    holder: str | None
    """Who holds the run now (None: it is not runnable)."""


def claim(
    run_id: uuid.UUID,
    owner: str,
    lease_seconds: float,
    last_entry: int,
    settings: Settings,
    *,
    dead: str | None = None,
) -> Claimed | NotClaimed:
    """Take the run and load it for a step, in one statement: the claim, the run, its limits
    and the journal entries after `last_entry`. `dead`: a holder known to be gone, whose live
    lease may be taken."""
    params = {
        **limits_params(run_id, settings),
        "owner": owner,
        "lease": lease_seconds,
        "dead": dead,
        "last_id": last_entry,
    }
    ((row,),) = pipelined([("claim", params)])
    took = row.took
    if took is None:
        return NotClaimed(row.run["lease_owner"] if row.run is not None else None)
    entries = [SimpleNamespace(**entry) for entry in row.entries]
    run = SimpleNamespace(**row.run)
    return Claimed(took["fence"], took["taken_from"], _resumed(took), run, row.limits, entries)


def _resumed(took: Mapping[str, Any]) -> tuple[str, float] | None:
    if "resumed_cause" in took:
        return took["resumed_cause"], float(took["resumed_seconds"])
    if took["lapsed_seconds"] is not None:
        return "lease_expired", float(took["lapsed_seconds"])
    return None


def limits_params(run_id: uuid.UUID, settings: Settings) -> dict[str, Any]:
    capped = settings.nightly_cost_cap_usd is not None or settings.nightly_token_cap is not None
    return {
        "run_id": run_id,
        "night_capped": capped,
        "night_timezone": settings.night_timezone,
        "night_warning": NIGHT_WARNING,
        "night_stopped": NIGHT_STOPPED,
    }


def _entry_params(
    run_id: uuid.UUID, fence: int, key: str, step: int, step_name: str, payload: dict[str, Any]
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "fence": fence,
        "key": key,
        "step": step,
        "step_name": step_name,
        "payload": jsonb(payload),
    }


def read_limits(run_id: uuid.UUID, settings: Settings) -> Mapping[str, Any]:
    """The limits (schema.sql's nightshift_limits), as of now."""
    ((row,),) = pipelined([("limits", limits_params(run_id, settings))])
    return row.limits


def journal_reply(
    run_id: uuid.UUID,
    fence: int,
    key: str,
    step: int,
    step_name: str,
    payload: dict[str, Any],
    settings: Settings,
) -> Mapping[str, Any] | None:
    """Journal the model's reply and read the limits with it, in one statement: the limits, or
    None when the fence is gone (nothing was written)."""
    params = {
        **_entry_params(run_id, fence, key, step, step_name, payload),
        **limits_params(run_id, settings),
    }
    (rows,) = pipelined([("journal_reply", params)])
    return rows[0].limits if rows else None


def journal_entry(
    run_id: uuid.UUID, fence: int, key: str, step: int, step_name: str, payload: dict[str, Any]
) -> bool:
    """Journal one entry if the fence is current; False when it is gone (nothing written)."""
    params = _entry_params(run_id, fence, key, step, step_name, payload)
    (appended,) = pipelined([("journal_fenced", params)])
    return bool(appended)


def checkpoint(
    run_id: uuid.UUID,
    fence: int,
    tool_calls: int,
    usage: dict[str, Any],
    entries: Sequence[Entry],
    state: dict[str, Any] | None = None,
) -> float | None:
    """End the step: step + 1, its counters, the lease given up, its deferred entries and the
    agent state it changed (None: unchanged), in one statement. When the run was handed to its
    next step (app.HANDED_OFF), or None when the fence is gone (nothing written)."""
    params = {
        "run_id": run_id,
        "fence": fence,
        "tool_calls": tool_calls,
        **usage,
        "entries": jsonb(
            [
                {"key": e.key, "step": e.step, "step_name": e.step_name, "payload": e.payload}
                for e in entries
            ]
        ),
        "state": None if state is None else jsonb(state),
    }
    (checkpointed,) = pipelined([("checkpoint", params)])
    return float(checkpointed[0].handed_off) if checkpointed else None


def renew_leases(
    ids: list[uuid.UUID], fences: list[int], owners: list[str], seconds: list[float]
) -> list[Any]:
    """Extend each lease, skipping rows another transaction holds: rows (id, fence, renewed)
    for each lease still its holder's."""
    params = {"ids": ids, "fences": fences, "owners": owners, "leases": seconds}
    (renewed,) = pipelined([("renew_leases", params)])
    return renewed
