"""What a run that ends leaves behind, in the transaction that ends it: its pending approvals
are withdrawn (nobody will carry them out, so a later approval is refused), its actions nothing
will send now are released, and those that may have been sent become `outcome_unknown`, which
a person can settle although the run is over. A withdrawn or released key is taken over by the
next run that means the action, afresh; no key stays held by a run that will never use it.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, case, func, or_, select, update
from sqlalchemy.orm import Session

from models import Action, ActionAudit, ActionState, Run, RunStatus
from pipeline.logs import get_logger

log = get_logger("nightshift.obligations")

NIGHTSHIFT = "nightshift"
"""Who the audit trail says withdrew or released an action of a run that ended."""


def settle_actions_of_ended_txn(session: Session, which: ColumnElement[bool], reason: str) -> int:
    """Settle the unfinished actions of the runs matching `which` that have ended; how many."""
    ended = select(Run.id).where(which, Run.status.in_(RunStatus.terminal())).scalar_subquery()
    # Something may have gone out: an attempt with no saved reply, or a resend decided after
    # an unknown outcome. A person (or the service, asked by the next run) must say.
    maybe_sent = or_(
        Action.state == ActionState.ATTEMPTED,
        and_(Action.state == ActionState.INTENDED, Action.attempts > 0),
    )
    rows = session.execute(
        update(Action)
        .where(
            Action.run_id.in_(ended),
            Action.state.in_(
                (ActionState.PENDING_APPROVAL, ActionState.INTENDED, ActionState.ATTEMPTED)
            ),
        )
        .values(
            state=case(
                (Action.state == ActionState.PENDING_APPROVAL, ActionState.WITHDRAWN.value),
                (maybe_sent, ActionState.OUTCOME_UNKNOWN.value),
                else_=ActionState.RELEASED.value,
            ),
            resolution=reason,
            updated_at=func.now(),
        )
        .returning(Action.idempotency_key, Action.run_id, Action.state, Action.args_hash)
    ).all()
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
