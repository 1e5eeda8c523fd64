"""How a wait on the model provider ends, on real workers: at the outage horizon with reason
`model_unavailable` while the provider is still down, at a run's own deadline with reason
`deadline`, or, when the provider answers again, by one probe first and then the parked runs
resumed no faster than NIGHTSHIFT_MODEL_RESUME_PER_SECOND."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta
from itertools import groupby

import pytest
from sqlalchemy import func, select

from models import JournalEntry, RunEvent, RunStatus
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.integration.test_model_outage import waiting_on_model
from tests.support import wait_for, wait_for_status

DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}
RETRY_AFTER = 16.0
"""Longer than the step's brief retries last (MODEL_RETRY's 15 s cap): a run parks at its
first refusal, and no probe goes out sooner than this after one."""


def report(n: int) -> dict[str, str]:
    # A team of its own per run: each run has its own email key.
    return {"team": f"team-{n:03d}", "date": "2026-11-29"}


def database_now() -> datetime:
    with transaction() as session:
        return session.scalar(select(func.clock_timestamp()))


def parked_on_model(run_id: uuid.UUID) -> bool:
    """Whether the run's feed shows it waiting on the model at some point."""
    with transaction() as session:
        events = session.scalars(
            select(RunEvent.data).where(RunEvent.run_id == run_id, RunEvent.kind == "status")
        ).all()
    return any(str(e.get("waiting_on") or "").startswith("model:") for e in events)


def test_an_outage_past_the_horizon_fails_its_runs_and_a_deadline_inside_it_ends_first(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given runs that give up on the model after 25 s of outage (NIGHTSHIFT_MODEL_*), and a
    # provider answering 429 with retry-after 16 for two minutes
    horizon = 25.0
    monkeypatch.setenv("NIGHTSHIFT_MODEL_OUTAGE_HORIZON_SECONDS", str(horizon))
    get_settings.cache_clear()
    processes("beat", beat=True)
    processes("w1")
    began = database_now()
    sandbox.messages.outage(429, 120, retry_after=RETRY_AFTER)

    # when a run with no deadline and one due within 10 s start into it
    patient = start_run("nightly_report", report(1)).run_id
    hurried = start_run("nightly_report", report(2), deadline=timedelta(seconds=10)).run_id

    # then the hurried one ends at its deadline, while it waits on the model
    ended = wait_for_status(hurried, DONE, timeout=60)
    assert (ended.status, ended.stop_reason) == (RunStatus.FAILED, "deadline"), ended.error
    assert f"while it waited on model:{get_settings().model_name}" in ended.error
    assert ended.finished_at - began < timedelta(seconds=horizon)

    # and the patient one waited out the outage until the horizon, then failed
    # model_unavailable while the provider was still down
    row = wait_for_status(patient, DONE, timeout=horizon + 60)
    assert (row.status, row.stop_reason) == (RunStatus.FAILED, "model_unavailable"), row.error
    assert "NIGHTSHIFT_MODEL_OUTAGE_HORIZON_SECONDS" in row.error and "429" in row.error
    assert parked_on_model(patient) and parked_on_model(hurried)
    waited = (row.finished_at - began).total_seconds()
    assert horizon - 1 <= waited < horizon + 15, waited
    assert sandbox.messages.stats()["outage_seconds_left"] > 0

    # and the provider was asked a handful of times: each run once, then one probe no sooner
    # than the retry-after (none of the steps' brief retries: retry-after asked for longer)
    asked = sandbox.messages.stats()["requests"]
    assert 2 <= asked <= 2 + math.ceil(horizon / RETRY_AFTER), asked


RUNS = 50
RESUME_PER_SECOND = 2.0


def test_fifty_parked_runs_resume_after_one_probe_at_the_configured_pace(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given resumptions paced at 2 runs a second (4 a tick of 2 s), probes at most 5 s apart
    monkeypatch.setenv("NIGHTSHIFT_MODEL_RESUME_PER_SECOND", str(RESUME_PER_SECOND))
    monkeypatch.setenv("NIGHTSHIFT_MODEL_PROBE_MAX_SECONDS", "5")
    get_settings.cache_clear()
    tick = get_settings().tick_seconds
    pace = math.ceil(RESUME_PER_SECOND * tick)
    processes("beat", beat=True)
    processes("w1")

    # and 50 runs parked on a provider that answers 529 (retry-after 16)
    sandbox.messages.outage(529, 600, retry_after=RETRY_AFTER)
    runs = [start_run("nightly_report", report(n)).run_id for n in range(RUNS)]
    wait_for(lambda: waiting_on_model() == RUNS, timeout=90, what="every run to park")

    # when the provider answers again
    sandbox.messages.outage(529, 0)
    answered_again = database_now()

    # then every run succeeds
    for run_id in runs:
        row = wait_for_status(run_id, DONE, timeout=180)
        assert row.status == RunStatus.SUCCEEDED, (row.stop_reason, row.error)

    # and the first reply after the outage was one probe's, asked alone: no other run was
    # woken between the provider's return and that reply
    with transaction() as session:
        first_reply = session.execute(
            select(JournalEntry.run_id, JournalEntry.created_at)
            .where(JournalEntry.key.like("model:%"), JournalEntry.created_at >= answered_again)
            .order_by(JournalEntry.created_at)
            .limit(1)
        ).one()
        wakes = session.execute(
            select(RunEvent.run_id, RunEvent.created_at)
            .where(
                RunEvent.kind == "status",
                RunEvent.data["previous"].as_string() == RunStatus.WAITING.value,
                RunEvent.created_at >= answered_again,
            )
            .order_by(RunEvent.created_at)
        ).all()
    prober = first_reply.run_id
    before_reply = [w.run_id for w in wakes if w.created_at < first_reply.created_at]
    assert set(before_reply) <= {prober}, before_reply

    # and the others were woken once each, at most a tick's pace at a time, no faster than
    # 2 a second: ticks that ran late may come together, so a window of one tick holds at
    # most two ticks' worth
    resumed = [w for w in wakes if w.created_at > first_reply.created_at]
    assert sorted(w.run_id for w in resumed) == sorted(r for r in runs if r != prober)
    by_tick = [len(list(group)) for _, group in groupby(resumed, key=lambda w: w.created_at)]
    assert max(by_tick) <= pace, by_tick
    times = [w.created_at for w in resumed]
    for i, start in enumerate(times):
        within = [t for t in times[i:] if t - start < timedelta(seconds=tick)]
        assert len(within) <= 2 * pace, (start, len(within), by_tick)
    spread = (times[-1] - times[0]).total_seconds()
    assert spread >= (math.ceil(len(times) / pace) - 3) * tick, (spread, by_tick)
