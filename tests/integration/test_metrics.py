"""The reliability metrics, checked against the database they are computed from, and the
takeovers the runtime records for them (the tick and the claim)."""

from __future__ import annotations

import json
import math
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from models import Action, ActionState, ResumeCause, Resumption, Run, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.runs.start import create_run_txn, start_run
from pipeline.runs.tick import tick
from pipeline.views.metrics import collect
from tests.integration.api_fixtures import AUTH, client
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.integration.test_prometheus import scrape
from tests.support import claim, wait_for, wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29"}


def new_run(status: RunStatus, agent: str = "nightly_report", **values: Any) -> uuid.UUID:
    with transaction() as session:
        run_id = create_run_txn(session, agent, REPORT).run_id
        session.execute(update(Run).where(Run.id == run_id).values(status=status, **values))
    return run_id


def resumed(run_id: uuid.UUID, seconds: float | None) -> None:
    """A takeover of `run_id` that took `seconds` (None: not picked up yet)."""
    lost = func.now() - timedelta(minutes=10)
    values: dict[str, Any] = {"run_id": run_id, "cause": ResumeCause.LEASE_EXPIRED}
    values |= {"lost_at": lost, "fence": 2}
    if seconds is not None:
        values["resumed_at"] = lost + timedelta(seconds=seconds)
    with transaction() as session:
        session.execute(Resumption.__table__.insert().values(**values))


def action(run_id: uuid.UUID, state: ActionState, attempts: int, resolution: str | None) -> None:
    with transaction() as session:
        session.add(
            Action(
                idempotency_key=f"test:{uuid.uuid4()}",
                run_id=run_id,
                tool="send_report_email",
                service="email",
                args={},
                state=state,
                attempts=attempts,
                resolution=resolution,
                approvers=[],
            )
        )


def test_the_four_reliability_metrics_match_the_database(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given three succeeded runs, one failed, one cancelled, one still running
    ok = [new_run(RunStatus.SUCCEEDED, step=3, input_tokens=100, output_tokens=10)
          for _ in range(3)]  # fmt: skip
    failed = new_run(RunStatus.FAILED, step=1, input_tokens=50, output_tokens=5)
    new_run(RunStatus.CANCELLED)
    running = new_run(RunStatus.RUNNING)
    # and takeovers: two succeeded runs (one taken over twice), the failed one, and the
    # running one, which no worker has picked up yet
    resumed(ok[0], 2.0)
    resumed(ok[1], 1.0)
    resumed(ok[1], 3.0)
    resumed(failed, 4.0)
    resumed(running, None)
    # and six confirmed actions: three sent once, two resent for a recorded reason, one resent
    # with no reason recorded (a possible duplicate); one pending, one unknown
    for _ in range(3):
        action(ok[0], ActionState.CONFIRMED, 1, None)
    action(ok[1], ActionState.CONFIRMED, 2, "resent_with_key")
    action(ok[1], ActionState.CONFIRMED, 2, "lookup_not_found")
    action(ok[2], ActionState.CONFIRMED, 2, None)
    action(running, ActionState.PENDING_APPROVAL, 0, None)
    action(failed, ActionState.OUTCOME_UNKNOWN, 1, None)

    # when the metrics are computed
    metrics = collect()

    # then completion = succeeded / (succeeded + failed): cancelled runs are left out
    assert metrics.completion_ratio == pytest.approx(3 / 4)
    # resumption success = succeeded / finished among the runs taken over (ok0, ok1, failed)
    assert metrics.resumption_success_ratio == pytest.approx(2 / 3)
    # duplicate ratio = unexplained resends / confirmed actions
    assert metrics.duplicate_action_ratio == pytest.approx(1 / 6)
    # time to resume over the four finished takeovers [1, 2, 3, 4] s (interpolated quantiles)
    assert metrics.resume_seconds[0.5] == pytest.approx(2.5)
    assert metrics.resume_seconds[0.95] == pytest.approx(3.85)
    assert (metrics.resumptions, metrics.resumptions_open) == (4, 1)
    assert metrics.resume_seconds_sum == pytest.approx(10.0)
    # and the counts around them
    assert metrics.steps == {"nightly_report": 10}
    assert metrics.input_tokens == {"nightly_report": 350}
    assert metrics.actions[ActionState.PENDING_APPROVAL] == 1
    assert metrics.actions[ActionState.OUTCOME_UNKNOWN] == 1
    assert metrics.queue_depth is not None

    # and `nightshift metrics` prints them
    assert main(["metrics", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["run_completion_ratio"] == pytest.approx(0.75)
    assert printed["time_to_resume_seconds"]["p50"] == pytest.approx(2.5)


def test_an_empty_database_has_no_ratios_rather_than_zero(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = collect()
    assert metrics.completion_ratio is None and metrics.duplicate_action_ratio is None
    assert main(["metrics", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["run_completion_ratio"] is None
    assert printed["time_to_resume_seconds"] == {"p50": None, "p95": None, "count": 0, "sum": 0.0}
    assert main(["metrics"]) == 0
    assert "nightshift_queue_depth" in capsys.readouterr().out


def takeovers(run_id: uuid.UUID) -> list[Resumption]:
    with transaction() as session:
        return list(
            session.scalars(
                select(Resumption).where(Resumption.run_id == run_id).order_by(Resumption.id)
            )
        )


def expire_lease(run_id: uuid.UUID, seconds_ago: float) -> None:
    with transaction() as session:
        session.execute(
            text(
                "UPDATE runs SET lease_expires_at = now() - make_interval(secs => :ago) "
                "WHERE id = :id"
            ),
            {"ago": seconds_ago, "id": run_id},
        )


def test_the_tick_and_the_claim_record_each_takeover(db_url: str) -> None:
    # given a run whose worker claimed it and then died: its lease ran out 3 s ago
    run_id = new_run(RunStatus.RUNNING)
    assert claim(run_id, "doomed", lease_seconds=15) is not None
    assert takeovers(run_id) == []  # a first claim is no takeover
    expire_lease(run_id, 3)

    # when the tick finds it (twice: the second finds nothing new) and a worker claims it
    assert tick().resumed == [run_id]
    [opened] = takeovers(run_id)
    assert (opened.cause, opened.resumed_at) == (ResumeCause.LEASE_EXPIRED, None)
    lease = claim(run_id, "healthy", lease_seconds=15)
    assert lease is not None

    # then the takeover is closed, from the lease's expiry to the claim
    [closed] = takeovers(run_id)
    assert closed.resumed_at is not None and closed.fence == lease.fence
    assert 3 <= (closed.resumed_at - closed.lost_at).total_seconds() < 10

    # and a redelivered message that claims an expired lease with no tick in between records
    # its takeover itself; a normal hand-off (no lease) records nothing
    expire_lease(run_id, 1)
    assert claim(run_id, "redelivered", lease_seconds=15) is not None
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(lease_expires_at=None))
    assert claim(run_id, "next-step", lease_seconds=15) is not None
    assert [t.resumed_at is not None for t in takeovers(run_id)] == [True, True]

    # and a run left without a message (lease released, then nothing for a while) is one too
    lost = new_run(RunStatus.RUNNING)
    with transaction() as session:
        session.execute(
            text("UPDATE runs SET updated_at = now() - interval '1 minute' WHERE id = :id"),
            {"id": lost},
        )
    tick()
    claim(lost, "healthy", lease_seconds=15)
    [found] = takeovers(lost)
    assert found.cause == ResumeCause.NO_MESSAGE
    assert found.resumed_at is not None
    assert (found.resumed_at - found.lost_at).total_seconds() >= 60
    assert collect().resumptions == 3


def test_a_worker_killed_mid_step_shows_in_the_metrics(
    sandbox: Sandbox, processes: ProcessFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a worker that dies before checkpointing a step, holding the run's lease
    shared = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}
    (tmp_path / "metrics").mkdir()
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "before_checkpoint", **shared})
    run_id = start_run("nightly_report", REPORT).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die before its checkpoint")

    # when beat's tick and a healthy worker take the run over
    processes("beat", beat=True)
    processes("healthy", env=shared)
    row = wait_for_status(run_id, {"succeeded", "failed"}, timeout=90)

    # then the run finished, and the metrics count one resumed success, resumed within the
    # tick interval plus a claim (not the visibility timeout), and no duplicate action
    assert row.status == RunStatus.SUCCEEDED, row.error
    metrics = collect()
    assert metrics.resumption_success_ratio == 1.0
    assert metrics.resumptions >= 1 and metrics.resumptions_open == 0
    p95 = metrics.resume_seconds[0.95]
    assert p95 is not None and not math.isnan(p95) and 0 <= p95 < 30
    assert metrics.duplicate_action_ratio == 0.0
    assert metrics.completion_ratio == 1.0
    # and the healthy worker counted the takeover where it happened, for Prometheus
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", shared["PROMETHEUS_MULTIPROC_DIR"])
    scraped = scrape(client().get("/metrics", headers=AUTH).text)
    assert scraped[("nightshift_resumptions_total", (("cause", "lease_expired"),))] == 1
    assert scraped[("nightshift_time_to_resume_seconds_count", ())] == 1
    assert 0 <= scraped[("nightshift_time_to_resume_seconds_sum", ())] < 30
    finished = (("agent", "nightly_report"), ("reason", "completed"), ("status", "succeeded"))
    assert scraped[("nightshift_runs_finished_total", finished)] == 1
