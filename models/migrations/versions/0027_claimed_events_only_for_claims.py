"""a step_started event only for a claim: the time bound's give-up moves the fence without a
holder, and its event read as a step started on None

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-02 07:30:00.000000

The trigger run_claimed_event is in models/sql/schema.sql.
"""

from collections.abc import Sequence

from alembic import op

from models.sql import apply_schema

revision: str = '0027'
down_revision: str | None = '0026'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PREVIOUS_TRIGGER = """
DROP TRIGGER IF EXISTS run_claimed_event ON runs;
CREATE TRIGGER run_claimed_event AFTER UPDATE OF fence ON runs
    FOR EACH ROW WHEN (OLD.fence IS DISTINCT FROM NEW.fence)
    EXECUTE FUNCTION nightshift_run_event('claimed');
"""


def upgrade() -> None:
    apply_schema(op.get_bind())


def downgrade() -> None:
    # Only the trigger changed: put back the one 0024-0026 had.
    op.get_bind().exec_driver_sql(_PREVIOUS_TRIGGER)
