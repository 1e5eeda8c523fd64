"""One renewer a process keeps every lease its steps hold: one statement renews them all, and
only a lease that is gone reports lost."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime

from sqlalchemy import select, text, update

from models import Run
from pipeline.db import transaction
from pipeline.engine.leases import Heartbeat, Lease
from pipeline.runs.start import create_run_txn
from tests.support import claim

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}
LEASE = 3.0
INTERVAL = 0.3


def claimed(owner: str) -> Lease:
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", RUN_INPUT).run_id
    lease = claim(run_id, owner, lease_seconds=LEASE)
    assert lease is not None
    return lease


@contextmanager
def heartbeats(*leases: Lease) -> Iterator[list[Heartbeat]]:
    """A heartbeat kept for each lease, as a step keeps one."""
    with ExitStack() as stack:
        yield [stack.enter_context(Heartbeat(lease, LEASE, INTERVAL)) for lease in leases]


def expires_at(lease: Lease) -> datetime:
    with transaction() as session:
        until = session.scalar(select(Run.lease_expires_at).where(Run.id == lease.run_id))
    assert until is not None
    return until


def take_over(run_id: uuid.UUID) -> Lease:
    with transaction() as session:
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(lease_expires_at=text("now() - interval '1 second'"))
        )
    lease = claim(run_id, "worker-b", lease_seconds=30)
    assert lease is not None
    return lease


def renewers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lease-renewer" and t.is_alive()]


def test_only_the_lease_taken_over_is_lost_and_the_other_is_still_renewed(db_url: str) -> None:
    # given two leases held by this process, each kept by a heartbeat
    kept, taken = claimed("worker-a:1"), claimed("worker-a:2")
    kept_until = expires_at(kept)
    with heartbeats(kept, taken) as (kept_beat, taken_beat):
        # then nothing is renewed before an interval has passed
        time.sleep(INTERVAL / 2)
        assert expires_at(kept) == kept_until
        # when another worker takes one run over (a newer fence)
        take_over(taken.run_id)
        time.sleep(4 * INTERVAL)
        # then only that one reports lost; the other is renewed, by one thread for both
        assert taken_beat.lost and not kept_beat.lost
        assert (renewed_until := expires_at(kept)) > kept_until
        assert len(renewers()) == 1
        time.sleep(2 * INTERVAL)
        assert expires_at(kept) > renewed_until and not kept_beat.lost
    # and the new holder's lease is untouched by the old holder's heartbeat
    with transaction() as session:
        owner = session.scalar(select(Run.lease_owner).where(Run.id == taken.run_id))
    assert owner == "worker-b"


def test_a_run_whose_row_is_locked_holds_up_no_other_lease_and_is_not_lost(db_url: str) -> None:
    # given two held leases, one run's row locked by a long transaction (a send in flight)
    busy, free = claimed("worker-a:1"), claimed("worker-a:2")
    free_until = expires_at(free)
    with heartbeats(busy, free) as beats, transaction() as locking:
        locking.execute(text("SELECT 1 FROM runs WHERE id = :id FOR UPDATE"), {"id": busy.run_id})
        busy_until = expires_at(busy)
        time.sleep(4 * INTERVAL)
        # then the other lease is renewed meanwhile, and the busy one is not called lost
        assert expires_at(free) > free_until
        assert expires_at(busy) == busy_until
        assert not any(beat.lost for beat in beats)
    # when the lock is gone, the busy lease is renewed again
    with heartbeats(busy) as (busy_beat,):
        time.sleep(3 * INTERVAL)
        assert expires_at(busy) > busy_until and not busy_beat.lost


def test_a_heartbeat_that_left_is_no_longer_renewed(db_url: str) -> None:
    lease = claimed("worker-a:1")
    with heartbeats(lease):
        time.sleep(2 * INTERVAL)
    left_at = expires_at(lease)
    time.sleep(3 * INTERVAL)
    assert expires_at(lease) == left_at
