"""A writer holding an old fence can change nothing: not the run, its journal or its actions."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.exc import DBAPIError

from models import Action, ActionState, JournalEntry, Run
from pipeline.db import transaction
from pipeline.engine.leases import fenced, renew_held
from pipeline.errors import LeaseLost
from pipeline.runs.start import create_run_txn
from tests.support import claim

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}


def new_run() -> uuid.UUID:
    with transaction() as session:
        return create_run_txn(session, "nightly_report", RUN_INPUT).run_id


def expire_lease(run_id: uuid.UUID) -> None:
    with transaction() as session:
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(lease_expires_at=func.now() - text("interval '1 second'"))
        )


def test_claim_bumps_the_fence_and_a_live_lease_refuses_a_second_claim(db_url: str) -> None:
    run_id = new_run()
    first = claim(run_id, "worker-a", lease_seconds=30)
    assert first is not None and first.fence == 1
    assert claim(run_id, "worker-b", lease_seconds=30) is None
    assert first in renew_held({first: 30})[0]


def test_a_stale_fence_cannot_write_the_run_the_journal_or_an_action(db_url: str) -> None:
    # given worker A held the run, and B took over after A's lease expired
    run_id = new_run()
    stale = claim(run_id, "worker-a", lease_seconds=30)
    assert stale is not None
    expire_lease(run_id)
    current = claim(run_id, "worker-b", lease_seconds=30)
    assert current is not None and current.fence == stale.fence + 1

    # when A tries to write the run, the journal, or an action
    with pytest.raises(LeaseLost), fenced(stale) as session:
        session.execute(update(Run).where(Run.id == run_id).values(step=99))
    with pytest.raises(LeaseLost), fenced(stale) as session:
        session.execute(
            insert(JournalEntry).values(
                run_id=run_id, key="model:0", step=0, step_name="ask_model", payload={}
            )
        )
    with pytest.raises(LeaseLost), fenced(stale) as session:
        session.execute(
            insert(Action).values(
                idempotency_key="k1", run_id=run_id, tool="t", service="s", args={},
                state=ActionState.INTENDED,
            )
        )  # fmt: skip

    # then nothing of A's landed, A cannot renew, and B still writes
    assert stale not in renew_held({stale: 30})[0]
    with transaction() as session:
        assert session.scalar(select(Run.step).where(Run.id == run_id)) == 0
        assert session.scalar(select(func.count()).select_from(JournalEntry)) == 0
        assert session.scalar(select(func.count()).select_from(Action)) == 0
    with fenced(current) as session:
        session.execute(update(Run).where(Run.id == run_id).values(step=1))
    with transaction() as session:
        assert session.scalar(select(Run.step).where(Run.id == run_id)) == 1


def test_a_run_that_is_not_running_cannot_be_claimed(db_url: str) -> None:
    run_id = new_run()
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(status="waiting"))
    assert claim(run_id, "worker-a", lease_seconds=30) is None


def test_a_late_heartbeat_cannot_revive_a_lease_the_step_handed_off(db_url: str) -> None:
    # given a step that checkpointed and handed the run to its next step (lease cleared)
    run_id = new_run()
    lease = claim(run_id, "worker-a", lease_seconds=30)
    assert lease is not None
    with fenced(lease) as session:
        session.execute(
            update(Run).where(Run.id == run_id).values(lease_owner=None, lease_expires_at=None)
        )
    # when its heartbeat thread renews a moment too late
    assert lease not in renew_held({lease: 30})[0]
    # then the next step's message can still claim the run at once
    assert claim(run_id, "worker-b", lease_seconds=30) is not None


def test_a_transaction_left_idle_by_a_cut_off_worker_does_not_lock_its_run_for_long(
    db_url: str,
) -> None:
    from pipeline.settings import get_settings

    lease = get_settings().lease_seconds
    run_id = new_run()
    first = claim(run_id, "worker-a", lease_seconds=lease)
    assert first is not None
    expire_lease(run_id)
    # given a worker that locked its run's row in a transaction and then went silent (its
    # network cut: PostgreSQL sees a session idle in a transaction)
    silenced = pytest.raises(DBAPIError, match=r"idle-in-transaction|terminat|closed")
    with silenced, fenced(first) as session:
        started = time.monotonic()
        # when another worker wants the run, its lease having run out
        with ThreadPoolExecutor(1) as pool:
            taken = pool.submit(claim, run_id, "worker-b", lease).result(timeout=lease + 10)
            waited = time.monotonic() - started
        session.execute(text("SELECT 1"))  # the silent worker's next statement
    # then PostgreSQL ended the idle session after a lease, and the other worker got the run
    assert taken is not None and taken.fence == first.fence + 1
    assert lease - 1 < waited < lease + 5
