"""Per-run limits on a real worker: a run that would go on for ever stops at its agent's
max_tool_calls, max_run_tokens or max_steps, before the call that would pass it, with its
reason, and (for the budgets) one alert about the run."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select

from models import Alert, RunStatus
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, tool_results, wait_for_status

AGENTS = (
    "tests.fixture_agents:ENDLESS_TOOL_CALLS",
    "tests.fixture_agents:ENDLESS_TOKENS",
    "tests.fixture_agents:ENDLESS_STEPS",
)
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}


def test_each_per_run_limit_stops_an_endless_run_with_its_reason(
    db_url: str,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given agents that shout once more every step and are never done, each with one limit
    register_agents(*AGENTS)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()
    processes("w1", concurrency=3)

    # when a run of each starts
    by_calls = start_run("endless_tool_calls", {"word": "a"}).run_id
    by_tokens = start_run("endless_tokens", {"word": "b"}).run_id
    by_steps = start_run("endless_steps", {"word": "c"}).run_id
    rows = {run_id: wait_for_status(run_id, DONE) for run_id in (by_calls, by_tokens, by_steps)}

    # then each failed for its own limit, before the call that would pass it
    calls = rows[by_calls]
    assert (calls.status, calls.stop_reason) == (RunStatus.FAILED, "max_tool_calls")
    assert calls.tool_calls == 3 and len(tool_results(by_calls, "shout")) == 3
    tokens = rows[by_tokens]
    assert (tokens.status, tokens.stop_reason) == (RunStatus.FAILED, "max_tokens")
    used = tokens.input_tokens + tokens.output_tokens
    assert used >= 400 and "the limit is 400" in tokens.error
    assert tokens.step >= 1, "it stops at the first check past the limit, not before"
    steps = rows[by_steps]
    assert (steps.status, steps.stop_reason, steps.step) == (RunStatus.FAILED, "max_steps", 4)
    assert len(tool_results(by_steps, "shout")) == 4

    # and the two budgets raised one alert each, about their run
    with transaction() as session:
        alerts = {(a.kind, a.subject) for a in session.scalars(select(Alert))}
    assert alerts == {
        ("budget_max_tool_calls", f"run:{by_calls}"),
        ("budget_max_tokens", f"run:{by_tokens}"),
    }
    assert run_row(by_calls).lease_owner is None
