"""What counts as a failed attempt in a row of a run's step (towards max_step_attempts).

A lease that lapsed because PostgreSQL restarted is none (its holder could not renew it); one
that lapsed while the server was up is, whether the tick or a claim finds it. The rule reads
the real server's `pg_postmaster_start_time()`: a lease expiring a second after it is one the
restart took, on this suite's server as after any restart (the chaos harness restarts its own
PostgreSQL under running steps). And an attempt that parks its run ends the failures in a row:
a step that waits on several approvals runs as several attempts of one step."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from models import RunStatus
from pipeline.app import send_step
from pipeline.db import transaction
from pipeline.engine.step_sql import Claimed, claim
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory, Services
from tests.support import wait_for, wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29"}
HOLDER = "host-a:4242:ThreadPoolExecutor-0_0:abc.1"


def held_until(run_id: uuid.UUID, expires: str) -> None:
    """The run's step held by HOLDER, its lease expiring at the SQL expression `expires`."""
    with transaction() as session:
        session.execute(
            text(
                f"UPDATE runs SET fence = fence + 1, lease_owner = :holder, "
                f"lease_expires_at = {expires} WHERE id = :run_id"
            ),
            {"holder": HOLDER, "run_id": run_id},
        )


def attempts(run_id: uuid.UUID) -> Any:
    with transaction() as session:
        return session.execute(
            text("SELECT step, failed_step, failed_attempts, failures FROM runs WHERE id = :id"),
            {"id": run_id},
        ).one()


RESTART_TOOK_IT = "pg_postmaster_start_time() + interval '1.5 second'"
"""Between one lease and two after the start: a renewal answered just after the restart."""
LAPSED_JUST_NOW = "now() - interval '0.5 second'"


@pytest.fixture
def short_lease(db_url: str, monkeypatch: pytest.MonkeyPatch) -> float:
    """A 1 s lease, and a server up for longer than two of them and a second: a lapse just now
    is then one the server was up for (the embedded server of a suite may have started a moment
    ago)."""
    monkeypatch.setenv("NIGHTSHIFT_LEASE_SECONDS", "1")

    def uptime() -> float:
        with transaction() as session:
            return float(
                session.execute(
                    text("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")
                ).scalar_one()
            )

    wait_for(lambda: uptime() > 3.0, timeout=10, what="the server to be up for 3 s")
    return get_settings().lease_seconds


def test_the_tick_counts_a_lapse_only_when_postgresql_did_not_restart_under_it(
    short_lease: float,
) -> None:
    # given a run whose step's lease expired a second after the server (re)started
    run_id = start_run("nightly_report", REPORT).run_id
    held_until(run_id, RESTART_TOOK_IT)

    # when the tick hands it on
    assert run_id in tick(get_settings()).resumed

    # then the lapse is recorded as the restart's and not counted: the run is no suspect
    row = attempts(run_id)
    assert (row.failed_step, row.failed_attempts) == (row.step, 0)
    (entry,) = row.failures
    assert entry["database_restarted"] is True and entry["counted"] is False
    assert entry["worker"] == HOLDER

    # when its next attempt's lease lapses with the server up all along
    held_until(run_id, LAPSED_JUST_NOW)
    assert run_id in tick(get_settings()).resumed

    # then that one counts, as the step's first failure
    row = attempts(run_id)
    assert row.failed_attempts == 1
    assert [e["database_restarted"] for e in row.failures] == [True, False]
    assert [e["counted"] for e in row.failures] == [False, True]


def test_a_claim_that_takes_a_lapsed_lease_applies_the_same_rule(short_lease: float) -> None:
    settings = get_settings()
    first, second = (start_run("nightly_report", {**REPORT, "team": t}).run_id for t in "ab")
    held_until(first, RESTART_TOOK_IT)
    held_until(second, LAPSED_JUST_NOW)

    # when another worker's claims take both
    for run_id in (first, second):
        took = claim(run_id, "host-b:7:MainThread:def.2", short_lease, 0, settings)
        assert isinstance(took, Claimed) and took.taken_from == HOLDER

    # then only the lapse the restart did not explain counts
    assert attempts(first).failed_attempts == 0
    assert attempts(second).failed_attempts == 1


def test_an_attempt_that_parks_its_run_ends_the_failures_in_a_row(
    services_up: Services, processes: ProcessFactory
) -> None:
    # given a patch run waiting for its pull request's approval
    processes("w1")
    bug = {"issue": 42, "repo": "acme/shop", "title": "totals are not rounded"}
    run_id = start_run("patch", bug).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=60)
    step = attempts(run_id).step

    # when the step is run again with two failed attempts of it on record (as after two
    # lapses between the approvals of a step that waits on several)
    lost = [{"kind": "crashed_worker", "worker": HOLDER, "counted": True}] * 2
    with transaction() as session:
        session.execute(
            text(
                "UPDATE runs SET status = 'running', waiting_on = NULL, failed_step = step, "
                "failed_attempts = 2, failures = CAST(:lost AS jsonb) WHERE id = :id"
            ),
            {"id": run_id, "lost": json.dumps(lost)},
        )
    send_step(run_id, agent="patch", step=step)

    # then it parks again, and its count is back to 0 with the entries kept for `show`
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=60)
    row = attempts(run_id)
    assert (row.step, row.failed_step, row.failed_attempts) == (step, step, 0)
    assert len(row.failures) == 2
