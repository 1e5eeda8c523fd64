"""Runs started by events: one run per (source, event id), however often the event arrives."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from models import ExternalEvent, Run
from pipeline.db import transaction
from pipeline.errors import InvalidInput, UnknownEventSource
from pipeline.runs.external_events import start_from_event
from tests.integration.conftest import ProcessFactory

REQUEST = {"team": "ops", "date": "2026-11-29", "email_to": "ops@example.com"}


def events() -> list[ExternalEvent]:
    with transaction() as session:
        return list(session.scalars(select(ExternalEvent)))


def runs() -> list[Run]:
    with transaction() as session:
        return list(session.scalars(select(Run)))


def test_the_same_event_delivered_three_times_starts_one_run(db_url: str) -> None:
    # given an ops tool that asks for a report, and a webhook that delivers it three times
    deliveries = [start_from_event("ops-report-request", "req-42", REQUEST) for _ in range(3)]
    # then one run started, and the later deliveries return its id
    assert [d.duplicate for d in deliveries] == [False, True, True]
    assert len({d.run_id for d in deliveries}) == 1
    [run] = runs()
    assert (run.id, run.agent, run.input) == (deliveries[0].run_id, "nightly_report", REQUEST)
    assert run.idempotency_key == "event:ops-report-request:req-42"
    # and the event row counts the deliveries
    [event] = events()
    assert (event.run_id, event.deliveries, event.payload) == (run.id, 3, REQUEST)
    assert deliveries[-1].deliveries == 3


def test_concurrent_deliveries_start_one_run(db_url: str) -> None:
    barrier = threading.Barrier(6)
    run_ids = []

    def deliver() -> None:
        barrier.wait()
        run_ids.append(start_from_event("ops-report-request", "req-7", REQUEST).run_id)

    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(run_ids) == 6 and len(set(run_ids)) == 1
    assert len(runs()) == 1 and events()[0].deliveries == 6


def test_an_unknown_source_is_refused_and_nothing_is_recorded(db_url: str) -> None:
    with pytest.raises(UnknownEventSource, match=r"'billing'.*ops-report-request"):
        start_from_event("billing", "inv-1", {})
    assert events() == [] and runs() == []


def test_a_bad_payload_is_refused_and_a_corrected_delivery_still_starts(db_url: str) -> None:
    # given a delivery without the report date
    with pytest.raises(InvalidInput, match="'date'"):
        start_from_event("ops-report-request", "req-9", {"team": "ops"})
    assert events() == [] and runs() == []
    # when the same event arrives with a good payload, it starts its run
    assert not start_from_event("ops-report-request", "req-9", REQUEST).duplicate
    assert len(runs()) == 1


def test_other_services_start_runs_from_events_with_delay(
    db_url: str, processes: ProcessFactory
) -> None:
    # given a worker, and a service that sends the same event three times through Celery
    from pipeline.tasks import start_from_event as task

    processes("w1")
    replies = [task.delay("ops-report-request", "req-99", REQUEST) for _ in range(3)]
    # then every reply is the one run's id, as a string
    ids = {reply.get(timeout=30) for reply in replies}
    assert len(ids) == 1
    assert {str(run.id) for run in runs()} == ids
