"""What a run that ends leaves behind, in the transaction that ends it: its pending approvals
are withdrawn (nobody will carry them out, so a later approval is refused), its actions nothing
will send now are released, and those that may have been sent become `outcome_unknown`, which
a person can settle although the run is over. A withdrawn or released key is taken over by the
next run that means the action, afresh; no key stays held by a run that will never use it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy.orm import Session

import pipeline.statements as statements
from pipeline.logs import get_logger

log = get_logger("nightshift.obligations")

NIGHTSHIFT = "nightshift"
"""Who the audit trail says withdrew or released an action of a run that ended."""


def settle_actions_of_ended_txn(
    session: Session, run_ids: Collection[uuid.UUID], reason: str
) -> int:
    """Settle the unfinished actions of those of `run_ids` that have ended, each change in the
    audit trail (actions.sql settle_actions_of_ended); how many."""
    if not run_ids:
        return 0
    via = f"the run ended ({reason})"[:200]
    rows = statements.rows(
        session, "settle_actions_of_ended", run_ids=list(run_ids), reason=reason,
        by=NIGHTSHIFT, via=via,
    )  # fmt: skip
    for row in rows:
        log.info("action %s: %s, as its run ended (%s)", row.idempotency_key, row.state, reason)
    return len(rows)
