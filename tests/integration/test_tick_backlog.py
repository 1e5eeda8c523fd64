"""The tick re-sends a run left without a message, but not one whose message still waits behind
a backlog: step messages are taken first in, first out, so only a run handed off before the
oldest step message still queued can have lost its message."""

from __future__ import annotations

import uuid

import redis
from sqlalchemy import text

from models import RunStatus
from pipeline.app import send_step
from pipeline.db import transaction
from pipeline.runs.start import create_run_txn
from pipeline.runs.tick import tick
from pipeline.settings import get_settings

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}


def handed_off(minutes_ago: int) -> uuid.UUID:
    """A running run with no lease whose last hand-off was `minutes_ago` (past the grace), and
    no step message: the one its start sent is taken out of the queue again."""
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", RUN_INPUT).run_id
    with transaction() as session:
        session.execute(
            text(
                "UPDATE runs SET status = :running, "
                "updated_at = now() - make_interval(mins => :ago) WHERE id = :id"
            ),
            {"running": RunStatus.RUNNING.value, "ago": minutes_ago, "id": run_id},
        )
    client = redis.Redis.from_url(get_settings().broker_url or "")
    try:
        client.delete(get_settings().queue)
    finally:
        client.close()
    return run_id


def test_a_run_behind_the_backlog_is_not_sent_again_and_a_lost_one_is(db_url: str) -> None:
    # given a backlog whose oldest step message is for a run handed off 5 minutes ago,
    # a run handed off before it that has no message (lost in a crash after its commit),
    # and one handed off after it, whose message is still queued behind it
    lost, oldest_queued, behind = (handed_off(minutes_ago=m) for m in (10, 5, 3))
    send_step(oldest_queued, agent="nightly_report")
    send_step(behind, agent="nightly_report")

    # when the tick looks for runs that should be moving and are not
    report = tick()

    # then only the run whose message was lost is sent again
    assert report.resumed == [lost]


def test_a_run_handed_off_a_moment_before_the_oldest_queued_one_is_not_sent_again(
    db_url: str,
) -> None:
    # given a backlog whose oldest message is for a run handed off 5 minutes ago, and a run
    # handed off a second earlier whose message reached the queue after it (its transaction
    # started first and committed later, as under load)
    oldest_queued = handed_off(minutes_ago=5)
    inverted = handed_off(minutes_ago=5)
    with transaction() as session:
        session.execute(
            text("UPDATE runs SET updated_at = updated_at - interval '1 second' WHERE id = :id"),
            {"id": inverted},
        )
    send_step(oldest_queued, agent="nightly_report")
    send_step(inverted, agent="nightly_report")

    # when the tick looks, then it sends neither again: its message is still in the queue
    assert tick().resumed == []


def test_with_no_backlog_every_run_past_the_grace_is_sent_again(db_url: str) -> None:
    # given two runs left without a message and nothing queued
    first, second = handed_off(minutes_ago=10), handed_off(minutes_ago=3)

    # when the tick runs, then both are sent again, the longest-standing first
    assert tick().resumed == [first, second]
