"""A service with nothing but `celery[redis]` installed starts a run by task name and gets its
outcome with `AsyncResult(run_id).get()`: the tick stores a finished run's outcome in the result
backend under the run's id, and no worker waits with the client."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import uuid
from pathlib import Path

import redis
from celery.result import AsyncResult
from sqlalchemy import func, select, update

from models import Run, RunStatus
from pipeline.agent_definition import BatchPlan
from pipeline.app import app
from pipeline.db import transaction
from pipeline.runs.fanout import create_batch_txn
from pipeline.runs.published_outcomes import outcome_json, publish_outcomes
from pipeline.runs.start import start_run
from pipeline.views.outcomes import outcome
from tests.integration.conftest import ProcessFactory, Sandbox

CLIENT = textwrap.dedent(
    """
    import json, os, sys
    from celery import Celery
    from celery.result import AsyncResult

    broker = os.environ["NIGHTSHIFT_BROKER_URL"]
    app = Celery("billing-service", broker=broker, backend=broker)
    request = {"team": "ops", "date": "2026-11-29"}
    run_id = app.send_task(
        "pipeline.start_run", args=["nightly_report", request], queue=os.environ["QUEUE"]
    ).get(timeout=60)
    print(json.dumps(AsyncResult(run_id, app=app).get(timeout=120)))
    """
)


def test_a_celery_only_client_gets_the_outcome_with_get(
    sandbox: Sandbox, processes: ProcessFactory, celery_only: Path
) -> None:
    # given a worker and beat (whose tick publishes outcomes)
    processes("w1")
    processes("beat", beat=True)
    # when a client with only Celery starts a run and waits on its id
    env = {"NIGHTSHIFT_BROKER_URL": os.environ["NIGHTSHIFT_BROKER_URL"],
           "QUEUE": os.environ["NIGHTSHIFT_QUEUE"], "PATH": os.environ["PATH"]}  # fmt: skip
    done = subprocess.run(
        [str(celery_only), "-c", CLIENT], env=env, capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    # then it has the run's outcome, as the API gives it
    run_id = uuid.UUID(got["run_id"])
    assert got["status"] == "succeeded" and "written and sent" in got["result"]["text"]
    assert got == outcome(run_id).as_json()
    with transaction() as session:
        row = session.execute(select(Run).where(Run.id == run_id)).scalar_one()
        assert row.outcome_published
    assert outcome_json(row) == got


UNKNOWN_AGENT_CLIENT = textwrap.dedent(
    """
    import os
    from celery import Celery

    broker = os.environ["NIGHTSHIFT_BROKER_URL"]
    app = Celery("triage-service", broker=broker, backend=broker)
    sent = app.send_task("pipeline.start_run", args=["acme_triage", {"ticket": 7}, "acme-7"],
                         queue=os.environ["QUEUE"])
    try:
        sent.get(timeout=60)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
    """
)


def test_a_celery_only_client_learns_why_no_worker_started_its_run(
    db_url: str, processes: ProcessFactory, celery_only: Path
) -> None:
    # given a worker without the team's agent, which hands a start on for 2 s
    processes("w1", env={"NIGHTSHIFT_UNKNOWN_AGENT_SECONDS": "2"})
    # when a client with only Celery starts a run of it and waits for the run id
    env = {"NIGHTSHIFT_BROKER_URL": os.environ["NIGHTSHIFT_BROKER_URL"],
           "QUEUE": os.environ["NIGHTSHIFT_QUEUE"], "PATH": os.environ["PATH"]}  # fmt: skip
    done = subprocess.run(
        [str(celery_only), "-c", UNKNOWN_AGENT_CLIENT],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # then its .get() raises the reason, naming the agent and the worker, and no run exists
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "UnknownAgent: no worker that took this start in 2 s (NIGHTSHIFT_UNKNOWN_AGENT_SECONDS) "
        "has agent 'acme_triage'; the last was w1."
    ), done.stdout
    with transaction() as session:
        assert session.scalar(select(Run.id).where(Run.agent == "acme_triage")) is None


def test_a_batchs_children_leave_no_outcome_in_the_result_backend(db_url: str) -> None:
    # given a finished run a caller started and a finished night of three children
    started = start_run("bench", {"steps": 1}).run_id
    plan = BatchPlan(
        batch_id=f"night-{uuid.uuid4().hex[:8]}", name="night", child_agent="bench",
        child_inputs=[{"steps": 1}] * 3, synthesis_agent="bench_synthesis", params={},
    )  # fmt: skip
    with transaction() as session:
        children = create_batch_txn(session, plan)
    with transaction() as session:
        session.execute(
            update(Run)
            .where(Run.id.in_([*children, started]))
            .values(status=RunStatus.SUCCEEDED, finished_at=func.now())
        )

    # when the tick publishes what finished
    published = publish_outcomes()

    # then the caller's run is in the result backend and no child is (no client holds a
    # child's id: a night of 100,000 would keep 55 MB there for a day)
    assert published == 1
    assert AsyncResult(str(started), app=app).state == "SUCCESS"
    assert [AsyncResult(str(child), app=app).state for child in children] == ["PENDING"] * 3


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "oncall_digest"
FORGOT_THE_QUEUE = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, os.environ["EXAMPLE"])
    from start_from_another_service import main
    main(os.environ["NIGHTSHIFT_BROKER_URL"], os.environ["QUEUE"], "ops", "2026-11-29", timeout=2)
    """
)


def test_a_start_sent_to_a_queue_no_worker_reads_ends_in_one_line_naming_the_queue(
    db_url: str, celery_only: Path
) -> None:
    # given a Celery-only client of the example that sends to a queue nobody consumes (as
    # leaving out queue= sends to Celery's own default)
    queue = f"nobody-reads-{uuid.uuid4().hex[:8]}"
    broker = os.environ["NIGHTSHIFT_BROKER_URL"]
    env = {"NIGHTSHIFT_BROKER_URL": broker, "QUEUE": queue, "EXAMPLE": str(EXAMPLE),
           "PATH": os.environ["PATH"]}  # fmt: skip
    try:
        done = subprocess.run(
            [str(celery_only), "-I", "-c", FORGOT_THE_QUEUE],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        redis.Redis.from_url(broker).delete(queue)  # the message nobody will read
    # then its wait ends with one line that says why, not a bare TimeoutError
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"no run id after 2s: no nightshift worker consumes queue {queue!r}; "
        'check queue="nightshift" (nightshift\'s NIGHTSHIFT_QUEUE) and that a worker runs'
    ]
