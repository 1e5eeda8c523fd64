"""Statuses carry their transition rules: `sources_of` is the WHERE clause of the guarded UPDATE
that moves a record (tests/integration/test_status_guards.py runs it on PostgreSQL)."""

from __future__ import annotations

from models import ActionState, RunStatus


def test_terminal_run_statuses_go_nowhere() -> None:
    for status in RunStatus.terminal():
        assert not any(status in RunStatus.sources_of(other) for other in RunStatus)


def test_sources_of_lists_the_statuses_a_guarded_update_may_start_from() -> None:
    assert set(RunStatus.sources_of(RunStatus.SUCCEEDED)) == {RunStatus.RUNNING}
    assert set(RunStatus.sources_of(RunStatus.CANCELLED)) == {
        RunStatus.RUNNING,
        RunStatus.WAITING,
        RunStatus.NEEDS_ATTENTION,
    }


def test_an_action_is_never_confirmed_without_an_attempt() -> None:
    assert ActionState.INTENDED not in ActionState.sources_of(ActionState.CONFIRMED)
    assert ActionState.ATTEMPTED in ActionState.sources_of(ActionState.CONFIRMED)
    assert ActionState.OUTCOME_UNKNOWN in ActionState.sources_of(ActionState.ATTEMPTED)
    assert ActionState.CONFIRMED.is_terminal()
