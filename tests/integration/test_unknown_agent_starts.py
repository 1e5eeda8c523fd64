"""`start_run.delay(...)` from a service that has only Celery, taken by a worker without the
agent: handed on (the same task id, so the caller's `.get()` waits on) to a worker that has
it; when none does in time, `.get()` raises a clear error naming the agent and the worker,
nothing is recorded, and the worker logs no traceback."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import select

from models import Run, RunStatus
from pipeline.db import transaction
from pipeline.errors import UnknownAgent
from pipeline.processes.celery_process import wait_for
from pipeline.tasks import start_run
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status

ECHO = "tests.fixture_agents:ECHO"
DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
WITHOUT_ECHO = {"NIGHTSHIFT_AGENTS": ""}


def test_a_start_no_worker_can_run_answers_the_caller_with_why(
    db_url: str, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given only a worker without the agent, which hands a start on for 3 s
    register_agents(ECHO)
    stock = processes("stock", env={**WITHOUT_ECHO, "NIGHTSHIFT_UNKNOWN_AGENT_SECONDS": "3"})

    # when another service starts a run of it and waits for the run id
    sent = start_run.delay("echo_outside", {"word": "lost"}, "acme-ticket-9")

    # then .get() raises one clear error, naming the agent and the worker
    with pytest.raises(UnknownAgent) as raised:
        sent.get(timeout=60)
    said = str(raised.value)
    assert said.startswith(
        "no worker that took this start in 3 s (NIGHTSHIFT_UNKNOWN_AGENT_SECONDS) has agent "
        "'echo_outside'; the last was stock."
    ), said
    assert "unknown agent 'echo_outside'" in said and "\n" not in said
    # and nothing was recorded, and the worker logged no traceback
    with transaction() as session:
        assert session.scalar(select(Run.id).where(Run.agent == "echo_outside")) is None
    log = stock.log()
    assert "handing the start on to another worker" in log
    assert "Traceback" not in log and "raised unexpected" not in log


def test_a_start_is_handed_on_to_a_worker_that_has_the_agent(
    db_url: str, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given a start taken by a worker without the agent
    register_agents(ECHO)
    stock = processes("stock", env=WITHOUT_ECHO)
    sent = start_run.delay("echo_outside", {"word": "found"}, "acme-ticket-10")
    wait_for(lambda: "handing the start on" in stock.log(), timeout=30, what="a hand-on")

    # when a worker that has it joins
    processes("knows")

    # then the caller gets the run's id from the same task, and the run succeeds
    run_id = uuid.UUID(sent.get(timeout=90))
    row = wait_for_status(run_id, DONE)
    assert (row.status, row.idempotency_key) == (RunStatus.SUCCEEDED, "acme-ticket-10"), row.error
    assert "Traceback" not in stock.log()
