"""A night whose model provider goes down as the 02:00 batch fans out: the thirty children wait
the outage out, parked with no slot held, while one run at a time probes the provider; once a
probe gets a reply they resume a few at a time, and the synthesis runs once."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select

from models import ModelOutage, Run, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.engine.outage import MODEL_RETRY
from pipeline.keys import synthesis_key
from pipeline.runs.schedules import fire
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.settings import get_settings
from pipeline.views.gauges import DatabaseGauges
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.integration.test_batches import MONITOR, NIGHT, children, synthesis_of
from tests.support import wait_for, wait_for_status

CHILDREN = 30
SLOTS = 4
"""The one worker's concurrency: at most this many steps call the model at once."""
PROBE_MAX_SECONDS = 10.0


def waiting_on_model() -> int:
    with transaction() as session:
        query = select(func.count()).where(
            Run.status == RunStatus.WAITING, Run.waiting_on.startswith("model:")
        )
        return session.scalar(query) or 0


def requests_of(sandbox: Sandbox) -> list[dict[str, Any]]:
    """Every request the Messages API got, in order, with `at` as a datetime."""
    entries = [dict(e, at=datetime.fromisoformat(e["at"])) for e in sandbox.messages.log.entries()]
    return sorted(entries, key=lambda e: e["at"])


def night_through_outage(
    sandbox: Sandbox, processes: ProcessFactory, status: int, seconds: float, **outage: Any
) -> tuple[str, datetime]:
    """Fire the 02:00 batch into an outage of `seconds`; returns the batch and when it began."""
    processes("beat", beat=True)
    processes("worker", concurrency=SLOTS)
    began = datetime.now(UTC)
    sandbox.messages.outage(status, seconds, **outage)
    batch_id = fire(MONITOR.name, now=NIGHT, schedules=[MONITOR]).batch_id
    assert batch_id is not None
    return batch_id, began


def the_night_ended_well(batch_id: str, timeout: float) -> uuid.UUID:
    """Every child succeeded, none failed; the synthesis started once and ran."""
    synthesis_id = wait_for(lambda: synthesis_of(batch_id), timeout=timeout,
                            what="every child to finish and the synthesis to start")  # fmt: skip
    runs = children(batch_id)
    assert len(runs) == CHILDREN
    assert all(r.status == RunStatus.SUCCEEDED for r in runs), [
        (r.input["competitor"], r.status, r.stop_reason, r.error) for r in runs
    ]
    synthesis = wait_for_status(
        synthesis_id, {RunStatus.WAITING.value, RunStatus.SUCCEEDED.value}, timeout=60
    )
    assert synthesis.waiting_on is None or synthesis.waiting_on.startswith("approval:")
    with transaction() as session:
        syntheses = session.scalars(select(Run).where(Run.agent == "price_synthesis")).all()
        assert [s.idempotency_key for s in syntheses] == [synthesis_key(batch_id)]
        assert session.scalar(select(func.count()).select_from(ModelOutage)) == 0
    return synthesis_id


@pytest.fixture
def quick_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probes at most 10 s apart (the default 60 s would stretch the test past the window)."""
    monkeypatch.setenv("NIGHTSHIFT_MODEL_PROBE_MAX_SECONDS", str(PROBE_MAX_SECONDS))
    get_settings.cache_clear()


def test_thirty_children_wait_out_a_two_minute_overload(
    sandbox: Sandbox,
    pricing: PricingSandbox,
    processes: ProcessFactory,
    quick_probes: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given a provider that answers 529 (overloaded) for 120 s from the moment the batch fans out
    window = 120.0
    batch_id, began = night_through_outage(sandbox, processes, 529, window)

    # then the children park on the model, holding no worker slot, while the outage lasts
    wait_for(lambda: waiting_on_model() >= CHILDREN - SLOTS, timeout=60,
             what="the children to park on the model")  # fmt: skip
    assert sandbox.messages.stats()["outage_seconds_left"] > 0

    # and the operator reads that they wait on the model provider, and since when
    assert main(["runs", "--status", "waiting"]) == 0
    listed = capsys.readouterr().out
    assert "model_outage" in listed
    model = get_settings().model_name
    assert f"wait on the model provider ({model}), down since " in listed
    parked = next(r for r in children(batch_id) if r.status == RunStatus.WAITING)
    assert main(["show", str(parked.id)]) == 0
    shown = capsys.readouterr().out
    assert f"error: waiting for {model} to answer again (down since " in shown
    assert "HTTP 529" in shown
    gauges = {f.name: f for f in DatabaseGauges(get_settings()).collect()}
    waiting = gauges["nightshift_runs_waiting_on_model"].samples
    assert waiting and waiting[0].labels == {"model": model} and waiting[0].value >= 1
    since = gauges["nightshift_model_outage_started_seconds"].samples[0].value
    assert 0 <= since - began.timestamp() < 30

    # and after the window every run succeeds, the synthesis once
    the_night_ended_well(batch_id, timeout=window + 90)

    # and the requests the provider got during the window are bounded: each step in flight when
    # it began retried briefly (MODEL_RETRY) until the outage was recorded; after that, only
    # the one probe at a time, the first ~5 s after, then at least 5 s apart (half of
    # the doubled 5 s, jittered)
    refused = [e for e in requests_of(sandbox) if e["fault"] == "outage"]
    bound = SLOTS * MODEL_RETRY.attempts + 1 + int(window / 5.0)
    assert len(refused) <= bound, (len(refused), bound)
    assert len(refused) >= 3, "the outage was probed while it lasted"
    answered = [e for e in requests_of(sandbox) if e["status"] == 200]
    assert answered and min(e["at"] for e in answered) >= began
    assert (min(e["at"] for e in answered) - began).total_seconds() >= window - 1


def test_no_request_before_the_retry_after_of_a_429(
    sandbox: Sandbox, pricing: PricingSandbox, processes: ProcessFactory, quick_probes: None
) -> None:
    # given a provider that answers 429 with retry-after: 20 for 40 s from the fan-out on
    window, after = 40.0, 20.0
    batch_id, _ = night_through_outage(sandbox, processes, 429, window, retry_after=after)

    # then every run succeeds after the window, the synthesis once
    the_night_ended_well(batch_id, timeout=window + 2 * after + 60)

    # and once a 429 said "retry after 20 s", nothing asked again within 20 s of it but the
    # steps already in flight when the first one came (one worker's slots, each asking once)
    requests = requests_of(sandbox)
    refused = [e for e in requests if e["status"] == 429]
    first = refused[0]["at"]
    in_flight = [e for e in requests if (e["at"] - first).total_seconds() < after]
    assert len(in_flight) <= SLOTS, [(e["at"], e["status"]) for e in requests[:10]]
    for said in refused:
        too_soon = [
            e for e in requests
            if e not in in_flight and 0 < (e["at"] - said["at"]).total_seconds() < after
        ]  # fmt: skip
        assert not too_soon, (said, too_soon)
    assert len(refused) > len(in_flight), [
        ((e["at"] - first).total_seconds(), e["status"]) for e in requests[:12]
    ]  # the outage was probed again after 20 s
