"""Runs started by other services' events, once per (source, event id) however often it arrives.

The event row and the run are created in one transaction; a repeated delivery finds the row,
counts the delivery and returns the first run's id. The step is sent after the commit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import ExternalEvent
from pipeline.db import transaction
from pipeline.errors import InvalidInput, NightshiftError
from pipeline.keys import event_key
from pipeline.registry import registry
from pipeline.runs.deadlines import parse_deadline
from pipeline.runs.start import create_run_txn


@dataclass(frozen=True)
class StartedEvent:
    run_id: uuid.UUID
    duplicate: bool
    """True when the event had arrived before: the first delivery's run is returned."""
    deliveries: int = 1


def start_from_event(source: str, event_id: str, payload: Mapping[str, Any]) -> StartedEvent:
    """Start the source's agent for this event, unless the event arrived before."""
    with transaction() as session:
        return start_from_event_txn(session, source, event_id, payload)


def start_from_event_txn(
    session: Session, source: str, event_id: str, payload: Mapping[str, Any]
) -> StartedEvent:
    """The event's run; a run created here starts once the transaction commits."""
    agent, spec = registry().event_source(source)
    key = event_key(source, event_id)
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"the payload of event {source}/{event_id} is not JSON: {exc}") from None
    if not isinstance(payload, Mapping):
        raise InvalidInput(f"the payload of event {source}/{event_id} must be a JSON object")
    inserted = session.execute(
        insert(ExternalEvent)
        .values(source=source, event_id=event_id, payload=dict(payload))
        .on_conflict_do_nothing(index_elements=["source", "event_id"])
        .returning(ExternalEvent.id)
    ).scalar_one_or_none()
    if inserted is None:
        return _repeated(session, source, event_id)
    try:
        run_input = spec.to_input(payload)
        wanted = spec.deadline(payload) if callable(spec.deadline) else spec.deadline
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(
            f"event {source}/{event_id} cannot become a {agent.name} run: missing or bad {exc}"
        ) from None
    deadline = parse_deadline(wanted, f"the deadline of event {source}/{event_id}")
    # The key is a second guard: even without the event row, this event starts one run.
    started = create_run_txn(session, agent.name, run_input, key, deadline=deadline)
    session.execute(
        update(ExternalEvent).where(ExternalEvent.id == inserted).values(run_id=started.run_id)
    )
    return StartedEvent(started.run_id, duplicate=not started.created)


def _repeated(session: Session, source: str, event_id: str) -> StartedEvent:
    row = session.execute(
        update(ExternalEvent)
        .where(ExternalEvent.source == source, ExternalEvent.event_id == event_id)
        .values(deliveries=ExternalEvent.deliveries + 1)
        .returning(ExternalEvent.run_id, ExternalEvent.deliveries)
    ).one()
    if row.run_id is None:
        raise NightshiftError(f"event {source}/{event_id} arrived before, but its run is gone")
    return StartedEvent(row.run_id, duplicate=True, deliveries=row.deliveries)
