"""Attempts are shown to people only when one failed: `runs.attempt` counts every claim (one
per step), so `nightshift show` and `watch` said `attempts 3` of a run that never crashed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pipeline.cli.runs import failed_attempts_line
from pipeline.cli.watch import describe
from pipeline.views.feed import FeedEvent


def started(**data: Any) -> FeedEvent:
    at = datetime(2026, 12, 2, tzinfo=UTC)
    return FeedEvent((1, 1), "step_started", "r", None, at, {"step": 2, "worker": "w1", **data})


def test_watch_shows_an_attempt_only_for_a_step_started_again_after_a_failure() -> None:
    assert describe(started(attempt=3, step_attempt=1)) == "step 2 started on w1"
    assert describe(started(attempt=3)) == "step 2 started on w1"  # written before 0025
    assert describe(started(attempt=4, step_attempt=2)) == "step 2 started on w1 (attempt 2)"


def run(**values: Any) -> dict[str, Any]:
    return {"step": 3, "attempt": 3, "failed_step": None, "failed_attempts": 0, **values}


def test_show_says_nothing_of_attempts_for_a_run_that_never_failed_one() -> None:
    assert failed_attempts_line(run()) is None


def test_show_names_the_failed_step_and_whether_its_failures_still_count() -> None:
    now = failed_attempts_line(run(attempt=5, failed_step=3, failed_attempts=2))
    assert now == (
        "failed attempts of step 3: 2 (counted towards max_step_attempts); claims in all: 5"
    )
    past = failed_attempts_line(run(attempt=5, failed_step=1, failed_attempts=1))
    assert past == "failed attempts of step 1: 1; claims in all: 5"
