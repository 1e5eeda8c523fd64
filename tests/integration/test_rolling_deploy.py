"""A rolling deploy under load: while a night of notifications runs on three workers, each
worker in turn is sent SIGTERM in the middle of its steps (a warm shutdown: it finishes the
steps it is in, its queued messages go back to the queue) and replaced by a new process before
the next one goes. No step is lost (nothing had to be taken over or re-sent by the tick), no
notification is sent twice (the service sends every request it gets), and each old worker
exits by itself once its steps are done.

bench/rolling_deploy.py measures the same on a 1,000-child night, and what it adds to its wall.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from sqlalchemy import text

from models import RunStatus
from pipeline import BatchPlan
from pipeline.db import transaction
from pipeline.registry import registry
from pipeline.runs.fanout import create_batch_txn
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, wait_for, wait_for_status

CHILDREN = 240
SLOW_SEND, FAST_SEND = 2.0, 0.05
"""The email service answers slowly while the workers are replaced (a night that outlasts the
roll however loaded the machine is), quickly after."""
AGENTS = ("tests.fixture_agents:NOTIFIER", "tests.fixture_agents:NOTIFY_SUMMARY")


def leases_held_by(pid: int) -> int:
    """Runs whose live lease the process holds (lease_owner is host:pid:thread)."""
    with transaction() as session:
        query = (
            "SELECT count(*) FROM runs WHERE lease_expires_at > now()"
            " AND split_part(lease_owner, ':', 2) = :pid"
        )
        return int(session.execute(text(query), {"pid": str(pid)}).scalar_one())


def recoveries(runs: list[uuid.UUID]) -> list[tuple[str, str]]:
    """The takeovers and re-sends the night's runs needed, and their failed attempts."""
    with transaction() as session:
        taken = session.execute(
            text("SELECT run_id::text, cause::text FROM resumptions WHERE run_id = ANY(:runs)"),
            {"runs": runs},
        )
        failed = session.execute(
            text("SELECT id::text, failures::text FROM runs WHERE id = ANY(:runs)"
                 " AND failed_attempts > 0"),
            {"runs": runs},
        )  # fmt: skip
        return [tuple(row) for row in (*taken, *failed)]  # type: ignore[misc]


@pytest.mark.timeout(300)
def test_replacing_every_worker_one_at_a_time_loses_no_step_and_resends_nothing(
    sandbox: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given three workers and beat, the scripted model, and an email service that sends every
    # request it gets (a resend would be a second email) and is slow to answer while the
    # workers are replaced, so a worker told to stop is always in the middle of sends
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "lookup")
    get_settings.cache_clear()
    sandbox.email.mode = "no-keys-lookup"
    sandbox.email.delay_seconds = SLOW_SEND
    register_agents(*AGENTS)
    processes("beat", beat=True)
    workers = [processes(f"w{n}-1", concurrency=4) for n in (1, 2, 3)]

    # when a night of notifications starts
    incidents = [{"team": "ops", "id": f"INC-{n}"} for n in range(CHILDREN)]
    plan = BatchPlan("rolling", "deploy", "notifier", incidents, "notify_summary", {})
    registry()  # loaded as a process loads its agents, not inside the transaction
    with transaction() as session:
        children = create_batch_txn(session, plan)

    # and each worker in turn, while it holds runs, is told to stop and is replaced
    for n, old in enumerate(list(workers), start=1):
        wait_for(lambda old=old: leases_held_by(old.pid), timeout=60, interval=0.05,
                 what=f"{old.name} to hold a run")  # fmt: skip
        old.stop()
        assert old.process is not None and old.process.returncode == 0, old.log()[-3000:]
        assert "Warm shutdown" in old.log()
        workers.append(processes(f"w{n}-2", concurrency=4))
    running = [child for child in children if run_row(child).status == RunStatus.RUNNING.value]
    sandbox.email.delay_seconds = FAST_SEND

    # then every child and the synthesis succeed
    rows = [wait_for_status(c, {RunStatus.SUCCEEDED.value}, timeout=120) for c in children]
    synthesis = wait_for(
        lambda: run_row(rows[0].id).batch_id and _synthesis_of(rows[0].batch_id), timeout=60
    )
    wait_for_status(synthesis, {RunStatus.SUCCEEDED.value}, timeout=60)
    assert running, "the night ended before the last worker was replaced"

    # and every incident was notified once
    sent = Counter(d["subject"] for d in sandbox.email.deliveries())
    assert sorted(sent) == sorted(f"Incident {i['id']}" for i in incidents)
    assert set(sent.values()) == {1}, [s for s, n in sent.items() if n > 1]

    # and no step was lost: none was taken over, re-sent by the tick or failed
    assert recoveries([*children, synthesis]) == []


def _synthesis_of(batch_id: object) -> uuid.UUID | None:
    with transaction() as session:
        query = "SELECT synthesis_run_id FROM batches WHERE id = :batch"
        return session.execute(text(query), {"batch": batch_id}).scalar_one_or_none()
