"""The statements every step runs (models/sql/step.sql, by name), sent through
pipeline/statements.py `pipelined`: each transaction's statements together, so that each
transaction is one round trip to PostgreSQL: the claim with everything the step loads, the
model reply with the limits read after it, a tool result that is not the step's last, and the
checkpoint. Lease renewals, one statement a process, run here too.

Every write carries the fence; a step whose fence is gone writes nothing, and learns it from
the row that did not come back (the callers raise LeaseLost)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
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
    """load_run's row."""
    limits: Any
    """The limits statement's row."""
    entries: list[Any]
    """journal_since's rows."""


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
    """Take the run and load it for a step, in one round trip: the claim, the run, its limits
    and the journal entries after `last_entry`. `dead`: a holder known to be gone, whose live
    lease may be taken."""
    params = {"run_id": run_id, "owner": owner}
    took, closed, run, limits, entries = pipelined(
        [
            ("claim", {**params, "lease": lease_seconds, "dead": dead}),
            ("close_resumption", params),
            ("load_run", params),
            ("limits", limits_params(run_id, settings)),
            ("journal_since", {"run_id": run_id, "last_id": last_entry}),
        ]
    )
    if not took:
        return NotClaimed(run[0].lease_owner if run else None)
    resumed = _resumed(took[0], closed[0] if closed else None)
    return Claimed(took[0].fence, took[0].taken_from, resumed, run[0], limits[0], entries)


def _resumed(took: Any, closed: Any) -> tuple[str, float] | None:
    if closed is not None:
        return closed.cause, float(closed.seconds)
    if took.lapsed_seconds is not None:
        return "lease_expired", float(took.lapsed_seconds)
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


def read_limits(run_id: uuid.UUID, settings: Settings) -> Any:
    """The limits statement's row, as of now."""
    (limits,) = pipelined([("limits", limits_params(run_id, settings))])
    return limits[0]


def journal_reply(
    run_id: uuid.UUID,
    fence: int,
    key: str,
    step: int,
    step_name: str,
    payload: dict[str, Any],
    settings: Settings,
) -> Any | None:
    """Journal the model's reply and read the limits after it, in one round trip: the limits
    row, or None when the fence is gone (nothing was written)."""
    appended, limits = pipelined(
        [
            ("journal_fenced", _entry_params(run_id, fence, key, step, step_name, payload)),
            ("limits", limits_params(run_id, settings)),
        ]
    )
    return limits[0] if appended else None


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
        "keys": [entry.key for entry in entries],
        "steps": [entry.step for entry in entries],
        "step_names": [entry.step_name for entry in entries],
        "payloads": [jsonb(entry.payload) for entry in entries],
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
