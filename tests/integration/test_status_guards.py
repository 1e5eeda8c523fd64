"""PostgreSQL enforces a status's transitions: the guarded UPDATE (`WHERE state IN
sources_of(new)`) moves a record only from a state that may become the new one, and zero rows
is a conflict that changes nothing."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert, select

from models import Action, ActionState
from pipeline.db import transaction
from pipeline.engine.action_rows import set_state_txn
from pipeline.errors import StatusConflict
from pipeline.runs.start import create_run_txn

KEY = "nightly-report:2026-11-29:ops"


def an_action(state: ActionState) -> uuid.UUID:
    """A run owning one action in `state`."""
    with transaction() as session:
        run_id = create_run_txn(
            session, "nightly_report", {"team": "ops", "date": "2026-11-29"}
        ).run_id
        session.execute(
            insert(Action).values(
                idempotency_key=KEY, run_id=run_id, tool="post_report", service="email",
                args={}, state=state,
            )
        )  # fmt: skip
    return run_id


def state_of() -> ActionState:
    with transaction() as session:
        return session.scalar(select(Action.state).where(Action.idempotency_key == KEY))


def test_an_intended_action_cannot_be_confirmed_without_an_attempt(db_url: str) -> None:
    # given an action whose key is saved and nothing sent
    run_id = an_action(ActionState.INTENDED)

    # when its run tries to confirm it, then the database refuses and nothing changes
    with pytest.raises(StatusConflict, match="cannot become confirmed"), transaction() as session:
        set_state_txn(session, run_id, KEY, ActionState.CONFIRMED)
    assert state_of() == ActionState.INTENDED

    # and the moves the protocol makes go through: attempted, then confirmed
    for new in (ActionState.ATTEMPTED, ActionState.CONFIRMED):
        with transaction() as session:
            set_state_txn(session, run_id, KEY, new)
        assert state_of() == new


def test_a_confirmed_action_moves_no_more(db_url: str) -> None:
    run_id = an_action(ActionState.CONFIRMED)

    for new in ActionState:
        with pytest.raises(StatusConflict), transaction() as session:
            set_state_txn(session, run_id, KEY, new)
    assert state_of() == ActionState.CONFIRMED


def test_an_outcome_nobody_knows_may_be_sent_again(db_url: str) -> None:
    run_id = an_action(ActionState.OUTCOME_UNKNOWN)

    with transaction() as session:
        set_state_txn(session, run_id, KEY, ActionState.ATTEMPTED)

    assert state_of() == ActionState.ATTEMPTED
