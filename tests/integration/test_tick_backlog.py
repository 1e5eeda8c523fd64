"""The tick re-sends a run left without a message, but not one whose message still waits behind
a backlog: step messages are taken first in, first out, and each says when its run was handed
off, so only a run handed off before the oldest step message still queued can have lost its
message."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from sqlalchemy import func, select, text

from models import Resumption, Run, RunStatus
from pipeline.app import send_step
from pipeline.db import dispose_all, get_engine, transaction
from pipeline.processes.celery_process import wait_for
from pipeline.runs.start import create_run_txn
from pipeline.runs.tick import tick
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}


def _broker() -> redis.Redis:
    return redis.Redis.from_url(get_settings().broker_url or "")


def handed_off(minutes_ago: int) -> tuple[uuid.UUID, float]:
    """A running run with no lease whose last hand-off was `minutes_ago` (past the grace), and
    no step message: the one its start sent is taken out of the queue again. With the hand-off's
    time, as its step message would carry it."""
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", RUN_INPUT).run_id
    with transaction() as session:
        when = session.execute(
            text(
                "UPDATE runs SET status = :running, "
                "updated_at = now() - make_interval(mins => :ago) WHERE id = :id "
                "RETURNING extract(epoch FROM updated_at)"
            ),
            {"running": RunStatus.RUNNING.value, "ago": minutes_ago, "id": run_id},
        ).scalar_one()
    client = _broker()
    try:
        client.delete(get_settings().queue)
    finally:
        client.close()
    return run_id, float(when)


def queue(run: tuple[uuid.UUID, float]) -> None:
    run_id, when = run
    send_step(run_id, agent="nightly_report", handed_off=when)


def test_a_run_behind_the_backlog_is_not_sent_again_and_a_lost_one_is(db_url: str) -> None:
    # given a backlog whose oldest step message is for a run handed off 5 minutes ago,
    # a run handed off before it that has no message (lost in a crash after its commit),
    # and one handed off after it, whose message is still queued behind it
    lost, oldest_queued, behind = (handed_off(minutes_ago=m) for m in (10, 5, 3))
    queue(oldest_queued)
    queue(behind)

    # when the tick looks for runs that should be moving and are not
    report = tick()

    # then only the run whose message was lost is sent again
    assert report.resumed == [lost[0]]


def test_a_run_handed_off_a_moment_before_the_oldest_queued_one_is_not_sent_again(
    db_url: str,
) -> None:
    # given a backlog whose oldest message is for a run handed off 5 minutes ago, and a run
    # handed off a second earlier whose message reached the queue after it (its transaction
    # started first and committed later, as under load)
    oldest_queued = handed_off(minutes_ago=5)
    inverted_id, when = handed_off(minutes_ago=5)
    with transaction() as session:
        session.execute(
            text("UPDATE runs SET updated_at = updated_at - interval '1 second' WHERE id = :id"),
            {"id": inverted_id},
        )
    queue(oldest_queued)
    queue((inverted_id, when - 1))

    # when the tick looks, then it sends neither again: its message is still in the queue
    assert tick().resumed == []


def test_the_oldest_message_says_when_it_was_handed_off_whatever_its_run_did_since(
    db_url: str,
) -> None:
    # given a backlog of runs handed off 5 minutes ago, whose oldest message's run has moved
    # on since (a worker is claiming it right now, or the message is a duplicate): its row
    # was written a moment ago
    oldest, behind = handed_off(minutes_ago=5), handed_off(minutes_ago=5)
    queue(oldest)
    queue(behind)
    with transaction() as session:
        session.execute(
            text("UPDATE runs SET updated_at = now() WHERE id = :id"), {"id": oldest[0]}
        )

    # when the tick looks, then the run behind it is not sent again: the message, not the row,
    # says when the oldest queued step was handed off
    assert tick().resumed == []


def test_with_no_backlog_every_run_past_the_grace_is_sent_again(db_url: str) -> None:
    # given two runs left without a message and nothing queued
    first, second = handed_off(minutes_ago=10), handed_off(minutes_ago=3)

    # when the tick runs, then both are sent again, the longest-standing first
    assert tick().resumed == [first[0], second[0]]


def test_messages_that_do_not_say_when_they_were_handed_off_hold_the_re_sends_back(
    db_url: str,
) -> None:
    # given a run left without a message, and a queue whose oldest messages are not step
    # messages carrying a hand-off (an entry point's, or a sender older than the header)
    handed_off(minutes_ago=10)
    send_step(uuid.uuid4(), agent="nightly_report")

    # when the tick runs, then it sends nothing again: it cannot tell which runs still have a
    # message queued behind those
    assert tick().resumed == []


def test_a_backlog_older_than_the_grace_is_not_sent_again_while_the_tick_waits_for_a_connection(
    db_url: str, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a worker with 2 threads working through 40 runs made in one transaction (their
    # messages wait behind each other longer than the 2 s grace), and a tick whose process has
    # one database connection
    monkeypatch.setenv("NIGHTSHIFT_HANDOFF_GRACE_SECONDS", "2")
    monkeypatch.setenv("NIGHTSHIFT_DB_POOL_SIZE", "1")
    dispose_all()
    processes("w1", concurrency=2)
    with transaction() as session:
        runs = [
            create_run_txn(session, "bench", {"steps": 1, "model_seconds": 0.3}).run_id
            for _ in range(40)
        ]
    time.sleep(2.5)  # every run was handed off more than the grace ago
    client = _broker()
    queued = client.llen(get_settings().queue)
    assert queued >= 20, f"the worker took the backlog too fast ({queued} left) to test"

    # when the tick reads the queue and then waits for its connection (the worker's steps,
    # here the test, hold them all) while the worker takes and claims the oldest messages
    with ThreadPoolExecutor(1) as pool:
        held = get_engine().connect()
        try:
            ticked = pool.submit(tick)
            wait_for(
                lambda: client.llen(get_settings().queue) <= queued - 3,
                timeout=20,
                what="the worker to take the oldest messages",
            )
            time.sleep(0.5)  # and claim them
        finally:
            held.close()
        report = ticked.result(timeout=30)
    client.close()

    # then it sent nothing again, and every run finished with its one message
    assert report.resumed == []
    _every_run_succeeded(runs)
    with transaction() as session:
        assert session.scalar(select(func.count()).select_from(Resumption)) == 0


def _every_run_succeeded(runs: list[uuid.UUID]) -> None:
    def done() -> bool:
        with transaction() as session:
            statuses = session.scalars(select(Run.status).where(Run.id.in_(runs))).all()
        return all(status is RunStatus.SUCCEEDED for status in statuses)

    wait_for(done, timeout=90, what="every run to succeed")
