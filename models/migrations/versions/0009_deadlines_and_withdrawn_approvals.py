"""deadlines for waiting runs and batches; approvals withdrawn when their run ends

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES = ('pending_approval', 'intended', 'attempted', 'outcome_unknown', 'confirmed', 'failed', 'rejected')


def _states_check(states: tuple[str, ...]) -> None:
    op.drop_constraint(op.f('ck_actions_action_state'), 'actions', type_='check')
    listed = ", ".join(f"'{s}'" for s in states)
    op.create_check_constraint('action_state', 'actions', f"state IN ({listed})")


def upgrade() -> None:
    _states_check((*_STATES, 'withdrawn'))
    op.add_column('batches', sa.Column('deadline', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_runs_parked_deadline', 'runs', ['deadline'], unique=False, postgresql_where=sa.text("status IN ('waiting', 'needs_attention') AND deadline IS NOT NULL"))


def downgrade() -> None:
    op.drop_index('ix_runs_parked_deadline', table_name='runs', postgresql_where=sa.text("status IN ('waiting', 'needs_attention') AND deadline IS NOT NULL"))
    op.drop_column('batches', 'deadline')
    op.execute("UPDATE actions SET state = 'rejected' WHERE state = 'withdrawn'")
    _states_check(_STATES)
