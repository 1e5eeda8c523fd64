"""Runs started by other services' events, once per (source, event id) however often it arrives.

The event row and the run are created in one transaction; a repeated delivery finds the row,
counts the delivery and returns the first run's id. The step is enqueued after the commit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import Event
from pipeline.db import transaction
from pipeline.errors import InvalidInput, NightshiftError
from pipeline.handoff import enqueue_step
from pipeline.runs import check_key, create_run_txn


class UnknownEventSource(NightshiftError):
    """No event source is registered under that name."""


@dataclass(frozen=True)
class EventSource:
    agent: str
    to_input: Callable[[Mapping[str, Any]], dict[str, Any]]
    """The event's payload -> the run's input (a KeyError names a missing field)."""


@dataclass(frozen=True)
class StartedEvent:
    run_id: uuid.UUID
    duplicate: bool
    """True when the event had arrived before: the first delivery's run is returned."""
    deliveries: int = 1


def _ops_report_request(payload: Mapping[str, Any]) -> dict[str, Any]:
    """{"team": "ops", "date": "2026-11-29", optional "email_to", "sources"}."""
    run_input = {"team": payload["team"], "date": payload["date"]}
    return run_input | {k: payload[k] for k in ("email_to", "sources") if k in payload}


EVENT_SOURCES: dict[str, EventSource] = {
    # An ops tool asks for a report out of schedule (after an incident, say).
    "ops-report-request": EventSource("nightly_report", _ops_report_request),
}


def register_source(
    name: str, agent: str, to_input: Callable[[Mapping[str, Any]], dict[str, Any]]
) -> None:
    EVENT_SOURCES[name] = EventSource(agent, to_input)


def start_from_event(source: str, event_id: str, payload: Mapping[str, Any]) -> StartedEvent:
    """Start the source's agent for this event, unless the event arrived before."""
    with transaction() as session:
        started, created = start_from_event_txn(session, source, event_id, payload)
    if created:
        enqueue_step(started.run_id, agent=EVENT_SOURCES[source].agent)
    return started


def start_from_event_txn(
    session: Session, source: str, event_id: str, payload: Mapping[str, Any]
) -> tuple[StartedEvent, bool]:
    """The event's run, and whether this call created it (so the caller enqueues it)."""
    spec = _source(source)
    key = check_key(f"event:{source}:{check_key(event_id, 'event id')}", "event:<source>:<id>")
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"the payload of event {source}/{event_id} is not JSON: {exc}") from None
    if not isinstance(payload, Mapping):
        raise InvalidInput(f"the payload of event {source}/{event_id} must be a JSON object")
    inserted = session.execute(
        insert(Event)
        .values(source=source, event_id=event_id, payload=dict(payload))
        .on_conflict_do_nothing(index_elements=["source", "event_id"])
        .returning(Event.id)
    ).scalar_one_or_none()
    if inserted is None:
        return _repeated(session, source, event_id), False
    try:
        run_input = spec.to_input(payload)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(
            f"event {source}/{event_id} cannot become a {spec.agent} run: missing or bad {exc}"
        ) from None
    # The key is a second guard: even without the event row, this event starts one run.
    started = create_run_txn(session, spec.agent, run_input, key)
    session.execute(update(Event).where(Event.id == inserted).values(run_id=started.run_id))
    return StartedEvent(started.run_id, duplicate=not started.created), started.created


def _repeated(session: Session, source: str, event_id: str) -> StartedEvent:
    row = session.execute(
        update(Event)
        .where(Event.source == source, Event.event_id == event_id)
        .values(deliveries=Event.deliveries + 1)
        .returning(Event.run_id, Event.deliveries)
    ).one()
    if row.run_id is None:
        raise NightshiftError(f"event {source}/{event_id} arrived before, but its run is gone")
    return StartedEvent(row.run_id, duplicate=True, deliveries=row.deliveries)


def _source(name: str) -> EventSource:
    try:
        return EVENT_SOURCES[name]
    except KeyError:
        known = ", ".join(sorted(EVENT_SOURCES))
        raise UnknownEventSource(f"unknown event source {name!r}; known sources: {known}") from None
