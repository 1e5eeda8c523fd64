"""The finish of a run, built once (plain Core: the ORM's per-call statement building was a
third of a step's CPU, issue 14). The statements of every step are named SQL
(models/sql/queries.sql, pipeline/engine/step_sql.py)."""

from __future__ import annotations

from sqlalchemy import Boolean, bindparam, case, func, null, update

from models import Run, table_of
from pipeline.engine.leases import RELEASED
from pipeline.engine.usage import USAGE_COLUMNS

_RUNS_TABLE = table_of(Run)
_RUNS = _RUNS_TABLE.c


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
