"""The durable step engine with real worker processes, beat, PostgreSQL, Redis and the real SDK."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Callable

import redis
from sqlalchemy import func, select

from models import JournalEntry, RunStatus
from pipeline.app import send_step
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.sandbox.base import read_log
from pipeline.sandbox.responders import agent_responder
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import ServiceUrls, run_row, wait_for, wait_for_status

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}
STEPS = 6  # three fetches, the report, the email, the closing line
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}


def model_calls_by_step(sandbox: Sandbox) -> Counter[int]:
    """Requests that reached the Messages API, by step (step n sends 2n + 1 messages)."""
    return Counter((entry["messages"] - 1) // 2 for entry in read_log(sandbox.messages.log.path))


def journal_keys(run_id) -> list[str]:
    with transaction() as session:
        return list(session.scalars(select(JournalEntry.key).where(JournalEntry.run_id == run_id)))


def journaled(run_id, key: str) -> dict:
    with transaction() as session:
        return session.scalar(
            select(JournalEntry.payload).where(
                JournalEntry.run_id == run_id, JournalEntry.key == key
            )
        )


def first_call_then_agent(tool_use_id: str, name: str, tool_input: dict) -> Callable:
    """A model that first asks for this one tool call, then answers as the agent would."""
    first_call = True

    def respond(request: dict) -> dict:
        nonlocal first_call
        if first_call:
            first_call = False
            call = {"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input}
            return {"content": [call], "stop_reason": "tool_use"}
        return agent_responder(request)

    return respond


def holder_pid(run_id) -> int | None:
    owner = run_row(run_id).lease_owner
    return int(owner.split(":")[1]) if owner else None


def test_a_run_survives_sigkill_of_its_worker_and_journaled_calls_are_not_repeated(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given two workers, beat, and a model that takes a second to answer
    sandbox.messages.delay_seconds = 1.0
    workers = [processes("w1"), processes("w2")]
    processes("beat", beat=True)
    run_id = start_run("nightly_report", RUN_INPUT).run_id

    # when the worker holding the run is killed in the middle of step 2
    wait_for(lambda: run_row(run_id).step >= 2 and holder_pid(run_id), what="step 2 in flight")
    victim = next(w for w in workers if w.pid == holder_pid(run_id))
    step_at_kill = run_row(run_id).step
    victim.kill()
    killed_at = time.monotonic()

    # then the other worker takes over and finishes
    wait_for(lambda: (holder_pid(run_id) or 0) not in (0, victim.pid), timeout=30,
             interval=0.05, what="another worker to claim the run")  # fmt: skip
    resumed_after = time.monotonic() - killed_at
    print(f"\ntime from SIGKILL to resume on another worker: {resumed_after:.2f}s")
    row = wait_for_status(run_id, DONE, timeout=60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.step == STEPS
    assert row.attempt > STEPS  # the interrupted step was claimed twice

    # and only the step in flight at the kill may have asked the model twice
    calls = model_calls_by_step(sandbox)
    assert set(calls) == set(range(STEPS))
    repeated = {step for step, count in calls.items() if count > 1}
    assert repeated <= {step_at_kill}, calls
    keys = journal_keys(run_id)
    assert (
        len(keys) == len(set(keys)) == 2 * STEPS - 1
    )  # a model reply each step, a tool result in all but the last
    # a fetch is repeated only if the kill landed between the fetch and its journal entry
    fetches = sandbox.web.requests()
    assert sum(fetches.values()) <= 4, fetches


def test_a_frozen_worker_cannot_write_after_another_took_over(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a slow model, so the holder is inside a model call when it freezes
    sandbox.messages.delay_seconds = 1.5
    first = processes("frozen")
    processes("beat", beat=True)
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    wait_for(lambda: holder_pid(run_id) == first.pid and run_row(run_id).step >= 1,
             what="the first worker to hold the run")  # fmt: skip

    # when it is frozen past its lease and a second worker takes over and finishes
    first.signal(signal.SIGSTOP)
    stale_fence = run_row(run_id).fence
    second = processes("second")
    row = wait_for_status(run_id, DONE, timeout=60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.fence > stale_fence
    keys_before_thaw = journal_keys(run_id)

    # then, thawed, the frozen worker's writes are refused and change nothing
    first.signal(signal.SIGCONT)
    try:
        wait_for(lambda: "stopping without writing" in first.log(), timeout=60, what="LeaseLost")
    except TimeoutError:
        steps = "\n".join(line for line in first.log().splitlines() if "pipeline.tick" not in line)
        raise AssertionError(f"the thawed worker never hit LeaseLost:\n{steps[-6000:]}") from None
    time.sleep(1)
    assert journal_keys(run_id) == keys_before_thaw
    final = run_row(run_id)
    assert (final.status, final.step, final.fence) == (row.status, row.step, row.fence)
    assert len(keys_before_thaw) == len(set(keys_before_thaw))
    assert second.pid != first.pid


def test_a_step_delivered_twice_at_once_is_done_once(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    sandbox.messages.delay_seconds = 0.5
    processes("w1", concurrency=2)
    processes("w2", concurrency=2)
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    # the same step message, delivered again while the first copy is being worked on
    send_step(run_id, agent="nightly_report")
    send_step(run_id, agent="nightly_report")
    row = wait_for_status(run_id, DONE, timeout=60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    keys = journal_keys(run_id)
    assert len(keys) == len(set(keys)) == 2 * STEPS - 1
    assert all(count == 1 for count in model_calls_by_step(sandbox).values())


def test_temporary_model_errors_are_retried_through_the_sdk(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    sandbox.messages.timeout_seconds = 3  # longer than NIGHTSHIFT_MODEL_TIMEOUT=2
    sandbox.messages.inject([429, 529, "timeout", 500])
    processes("w1")
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=90)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert sandbox.messages.stats()["faults_served"] == 4


def test_a_bad_request_fails_the_run_with_its_reason(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    sandbox.messages.inject([400])
    processes("w1")
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=30)
    assert row.status == RunStatus.FAILED
    assert row.stop_reason == "model_error"
    assert "400" in row.error
    assert sandbox.messages.stats()["requests"] == 1  # permanent: not retried


def test_invalid_tool_arguments_go_back_to_the_model_and_the_run_continues(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    sandbox.messages.responder = first_call_then_agent("toolu_bad", "fetch_source", {"name": 42})
    processes("w1")
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    bad = journaled(run_id, "tool:toolu_bad")
    with transaction() as session:
        total = session.scalar(select(func.count()).select_from(JournalEntry))
    assert bad["is_error"] is True
    assert "invalid arguments" in bad["content"] and "name" in bad["content"]
    assert total == 2 * (STEPS + 1) - 1


def test_a_failed_tool_call_is_journaled_without_the_credentials_in_its_url(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch
) -> None:
    from pipeline.settings import get_settings

    # given a web service URL carrying credentials, and a fetch the service answers with 404
    web = sandbox.web.url.replace("http://", "http://ops:web-s3cret@")
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", web)
    get_settings.cache_clear()
    sandbox.messages.responder = first_call_then_agent(
        "toolu_missing", "fetch_source", {"name": "missing"}
    )
    processes("w1")

    # when the run goes on past the failed call
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)

    # then the journaled error says what failed and where, without the password
    assert row.status == RunStatus.SUCCEEDED, row.error
    failed = journaled(run_id, "tool:toolu_missing")
    assert failed["is_error"] is True
    assert "404" in failed["content"] and "ops:***@127.0.0.1" in failed["content"]
    assert "web-s3cret" not in failed["content"]


def test_steps_keep_no_result_in_the_broker(
    sandbox: Sandbox, processes: ProcessFactory, services: ServiceUrls
) -> None:
    # when a run's steps are done by a worker
    worker = processes("w1")
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    assert wait_for_status(run_id, DONE, timeout=60).status == RunStatus.SUCCEEDED

    # then none of them left a result behind in Redis (a noeviction broker); the last step's
    # "succeeded" line is written after the run's final commit, so wait for it
    def succeeded() -> list[str]:
        return re.findall(r"Task pipeline\.step\[([0-9a-f-]+)\] succeeded", worker.log())

    wait_for(lambda: len(succeeded()) >= STEPS, timeout=30, what="every step task's log line")
    task_ids = succeeded()
    client = redis.Redis.from_url(services.broker)
    try:
        assert not any(client.exists(f"celery-task-meta-{task_id}") for task_id in task_ids)
    finally:
        client.close()
