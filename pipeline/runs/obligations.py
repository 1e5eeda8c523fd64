"""What a run that ends leaves behind, in the transaction that ends it: its pending approvals
are withdrawn (nobody will carry them out, so a later approval is refused), its actions nothing
will send now are released, and those that may have been sent become `outcome_unknown`, which
a person can settle although the run is over. A withdrawn or released key is taken over by the
next run that means the action, afresh; no key stays held by a run that will never use it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import and_, bindparam, case, exists, func, or_, update
from sqlalchemy.orm import Session

from models import Action, ActionAudit, ActionState, Run, RunStatus, table_of
from pipeline.logs import get_logger

log = get_logger("nightshift.obligations")

NIGHTSHIFT = "nightshift"
"""Who the audit trail says withdrew or released an action of a run that ended."""


_ACTIONS = Action.__table__.c
_RUNS = Run.__table__.c

# Built once (plain Core): the finish of every run runs it (issue 14). Something may have gone
# out of an action that was attempted with no saved reply, or whose resend was decided after an
# unknown outcome: a person (or the service, asked by the next run) must say.
_SETTLE = (
    update(table_of(Action))
    .where(
        _ACTIONS.run_id.in_(bindparam("run_ids", expanding=True)),
        _ACTIONS.state.in_(
            (ActionState.PENDING_APPROVAL, ActionState.INTENDED, ActionState.ATTEMPTED)
        ),
        exists().where(_RUNS.id == _ACTIONS.run_id, _RUNS.status.in_(RunStatus.terminal())),
    )
    .values(
        state=case(
            (_ACTIONS.state == ActionState.PENDING_APPROVAL, ActionState.WITHDRAWN.value),
            (
                or_(
                    _ACTIONS.state == ActionState.ATTEMPTED,
                    and_(_ACTIONS.state == ActionState.INTENDED, _ACTIONS.attempts > 0),
                ),
                ActionState.OUTCOME_UNKNOWN.value,
            ),
            else_=ActionState.RELEASED.value,
        ),
        resolution=bindparam("reason"),
        updated_at=func.now(),
    )
    .returning(_ACTIONS.idempotency_key, _ACTIONS.run_id, _ACTIONS.state, _ACTIONS.args_hash)
)


def settle_actions_of_ended_txn(
    session: Session, run_ids: Collection[uuid.UUID], reason: str
) -> int:
    """Settle the unfinished actions of those of `run_ids` that have ended; how many."""
    if not run_ids:
        return 0
    params = {"run_ids": list(run_ids), "reason": reason}
    rows = session.execute(_SETTLE, params).all()
    via = f"the run ended ({reason})"[:200]
    for key, run_id, state, args_hash in rows:
        event = "withdrawn" if state is ActionState.WITHDRAWN else "run_ended"
        log.info("action %s: %s, as its run ended (%s)", key, state, reason)
        session.add(
            ActionAudit(
                action_key=key,
                run_id=run_id,
                event=event,
                by=NIGHTSHIFT,
                via=via,
                note=None if event == "withdrawn" else f"now {state}",
                args_hash=args_hash,
            )
        )
    return len(rows)
