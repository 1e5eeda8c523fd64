"""Statuses carry their transition rules."""

from __future__ import annotations

from models import ActionState, RunStatus


def test_terminal_run_statuses_go_nowhere() -> None:
    for status in RunStatus:
        if status.is_terminal():
            assert not any(status.can_become(other) for other in RunStatus)


def test_sources_of_lists_the_statuses_a_guarded_update_may_start_from() -> None:
    assert set(RunStatus.sources_of(RunStatus.SUCCEEDED)) == {RunStatus.RUNNING}
    assert set(RunStatus.sources_of(RunStatus.CANCELLED)) == {
        RunStatus.RUNNING,
        RunStatus.WAITING,
        RunStatus.NEEDS_ATTENTION,
    }


def test_an_action_is_never_confirmed_without_an_attempt() -> None:
    assert not ActionState.INTENDED.can_become(ActionState.CONFIRMED)
    assert ActionState.ATTEMPTED.can_become(ActionState.CONFIRMED)
    assert ActionState.OUTCOME_UNKNOWN.can_become(ActionState.ATTEMPTED)
    assert ActionState.CONFIRMED.is_terminal()
