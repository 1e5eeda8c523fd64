"""A prefork pool child that dies mid-step hands its run on at once: the worker reaps it as soon
as the kernel lets it (not at the pool's next 5 s maintenance), Celery re-sends the step
(task_retry_on_worker_lost, 1 s later) and the new attempt takes the run from the dead holder
without waiting for its lease. The child that replaces it starts with the model SDK loaded."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from models import RunEvent, RunStatus
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for, wait_for_status

DIES_SLOWLY = "tests.fixture_dying:DIES_SLOWLY"
RUNS = 5
DYING_SECONDS = 0.3
"""Between the dying child's files closing and its end: a kernel's moment, made long enough
that the worker always looks before it can reap the child."""
RETRY_COUNTDOWN = 1.0
"""pipeline.step's default_retry_delay: Celery re-sends a lost step that much later."""
REAPED_WITHIN = 1.5
"""The worker's next look lands within 0.1 s of the end. Without it, the pool's own timer
reaps the child 0-5 s later: all five claims within this bound about once in 500."""


def first_step_claims(run_id: uuid.UUID) -> list[RunEvent]:
    with transaction() as session:
        return list(
            session.scalars(
                select(RunEvent)
                .where(RunEvent.run_id == run_id, RunEvent.kind == "claimed")
                .where(RunEvent.data["step"].as_integer() == 0)
                .order_by(RunEvent.id)
            )
        )


@pytest.fixture
def prefork_worker(
    db_url: str,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., None]:
    """Start a prefork worker with two pool children that knows DIES_SLOWLY, with the
    environment variables given set first (None: unset)."""

    def start(**env: str | None) -> None:
        register_agents(DIES_SLOWLY)
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        processes("w1", pool="prefork", concurrency=2)

    return start


@pytest.mark.timeout(120)
def test_a_pool_child_that_dies_mid_step_is_reaped_and_its_run_claimed_again_at_once(
    prefork_worker: Callable[..., None], tmp_path: Path
) -> None:
    # given a prefork worker with the default lease (15 s), the agent's script as the model
    prefork_worker(
        ANTHROPIC_API_KEY=None, DYING_DIR=str(tmp_path), DYING_SECONDS=str(DYING_SECONDS)
    )

    # when runs whose tool kills its pool child, once a run, the way a process dies (its
    # files close first, and it can be reaped only some time later), run one after another
    for n in range(RUNS):
        run_id = start_run("dies_slowly", {"word": f"w{n}"}).run_id
        row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}, 60)

        # then each succeeds on its second attempt, taken from the dead child at once: its
        # lease had seconds to run, and the claim came the retry's countdown after the death
        # plus the moment the worker took to reap the child
        assert row.status == RunStatus.SUCCEEDED, row.error
        died_at = float((tmp_path / str(run_id)).read_text())
        first, second = first_step_claims(run_id)
        (failure,) = row.failures  # the dead child's attempt
        assert failure["worker"] == first.data["worker"] != second.data["worker"]
        assert second.data["step_attempt"] == 2
        resumed_after = second.created_at.timestamp() - died_at
        assert resumed_after < RETRY_COUNTDOWN + REAPED_WITHIN, (
            f"run {run_id} was claimed again {resumed_after:.2f} s after its pool child died"
        )


def noted_children(directory: Path) -> list[Path]:
    """What each pool child wrote down as it started (tests/fixture_dying.py)."""
    return [path for path in directory.iterdir() if path.is_file() and not path.suffix]


def test_pool_children_start_with_the_model_sdk_loaded_when_runs_call_the_model(
    prefork_worker: Callable[..., None], tmp_path: Path
) -> None:
    # given a worker whose runs call the model (an API key is set)
    # when it starts as a prefork worker with two pool children
    prefork_worker(ANTHROPIC_API_KEY="test-dummy-key", POOL_CHILDREN_DIR=str(tmp_path))

    # then both were forked with the SDK loaded: no child imports it in its first step (seconds
    # on a loaded machine), which is often the step it resumes from a child that died
    wait_for(lambda: len(noted_children(tmp_path)) >= 2, what="two pool children")
    started = [json.loads(child.read_text()) for child in noted_children(tmp_path)]
    assert started == [{"anthropic": True}] * 2
