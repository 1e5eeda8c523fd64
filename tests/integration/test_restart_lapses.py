"""A lease that lapsed because PostgreSQL restarted is no failed attempt of the run's step (its
holder could not renew it); one that lapsed while the server was up is, whether the tick or a
claim finds it. The rule reads the real server's `pg_postmaster_start_time()`: a lease
expiring a second after it is one the restart took, on this suite's server as after any
restart (the chaos harness restarts its own PostgreSQL under running steps)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text

from pipeline.db import transaction
from pipeline.engine.step_sql import Claimed, claim
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.settings import get_settings

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


RESTART_TOOK_IT = "pg_postmaster_start_time() + interval '1 second'"
LAPSED_JUST_NOW = "now() - interval '1 second'"


def test_the_tick_counts_a_lapse_only_when_postgresql_did_not_restart_under_it(
    db_url: str,
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


def test_a_claim_that_takes_a_lapsed_lease_applies_the_same_rule(db_url: str) -> None:
    settings = get_settings()
    first, second = (start_run("nightly_report", {**REPORT, "team": t}).run_id for t in "ab")
    held_until(first, RESTART_TOOK_IT)
    held_until(second, LAPSED_JUST_NOW)

    # when another worker's claims take both
    for run_id in (first, second):
        took = claim(run_id, "host-b:7:MainThread:def.2", settings.lease_seconds, 0, settings)
        assert isinstance(took, Claimed) and took.taken_from == HOLDER

    # then only the lapse the restart did not explain counts
    assert attempts(first).failed_attempts == 0
    assert attempts(second).failed_attempts == 1
