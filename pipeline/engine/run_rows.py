"""The statements of a step's own writes and reads of its run row, built once (plain Core and
SQL: the ORM's per-call statement building was a third of a step's CPU, issue 14)."""

from __future__ import annotations

from sqlalchemy import Boolean, bindparam, case, func, null, select, text, update

from models import Run, table_of
from pipeline.engine.budgets import RUN_AND_BATCH
from pipeline.engine.journal import DEFERRED_ENTRIES
from pipeline.engine.leases import RELEASED
from pipeline.engine.limits import LIMITS_COLUMNS
from pipeline.engine.usage import ADD_USAGE, USAGE_COLUMNS

_RUNS_TABLE = table_of(Run)
_RUNS = _RUNS_TABLE.c

# The run and what the first stop check reads, in one statement (built once, plain Core).
LOAD = (
    select(_RUNS.agent, _RUNS.input, _RUNS.step, _RUNS.max_steps, _RUNS.state, *LIMITS_COLUMNS)
    .select_from(RUN_AND_BATCH)
    .where(_RUNS.id == bindparam("run_id"))
)


# The checkpoint is one statement: the step's deferred journal entries (its last tool result),
# the fence check, the step's counters and giving up the lease (RELEASED) in the same UPDATE.
CHECKPOINT = text(
    f"""
    WITH entries AS ({DEFERRED_ENTRIES})
    UPDATE runs
       SET step = step + 1, tool_calls = tool_calls + :tool_calls, {ADD_USAGE},
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
     WHERE id = :run_id AND fence = :fence
    RETURNING step
    """
)


# The finish, built once: the status change where the run may still make it, the step's
# counters, and giving up the lease (after fenced()'s guard, which tells a lost lease apart
# from a status that changed under the step).
FINISH = (
    update(_RUNS_TABLE)
    .where(_RUNS.id == bindparam("run_id"), _RUNS.status.in_(bindparam("sources", expanding=True)))
    .values(
        status=bindparam("status", type_=_RUNS.status.type),
        stop_reason=bindparam("reason"),
        result=bindparam("result", type_=_RUNS.result.type),
        error=bindparam("error"),
        step=_RUNS.step + bindparam("steps_done"),
        finished_at=case((bindparam("terminal", type_=Boolean), func.now()), else_=null()),
        **{name: _RUNS[name] + bindparam(name) for name in USAGE_COLUMNS},
        **RELEASED,
    )
)
