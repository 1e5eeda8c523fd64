"""actions bound to their arguments (args_hash), and the released state for keys no run owns

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 14:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ('pending_approval', 'intended', 'attempted', 'outcome_unknown', 'confirmed', 'failed',
        'rejected', 'withdrawn')
_NEW = (*_OLD, 'released')


def _states(states: tuple[str, ...]) -> str:
    return "state IN (" + ", ".join(f"'{s}'" for s in states) + ")"


def upgrade() -> None:
    op.add_column('actions', sa.Column('args_hash', sa.String(length=64), nullable=True))
    op.add_column('action_audit', sa.Column('args_hash', sa.String(length=64), nullable=True))
    op.drop_constraint(op.f('ck_actions_action_state'), 'actions', type_='check')
    op.create_check_constraint(op.f('ck_actions_action_state'), 'actions', _states(_NEW))


def downgrade() -> None:
    op.execute("UPDATE actions SET state = 'failed' WHERE state = 'released'")
    op.drop_constraint(op.f('ck_actions_action_state'), 'actions', type_='check')
    op.create_check_constraint(op.f('ck_actions_action_state'), 'actions', _states(_OLD))
    op.drop_column('action_audit', 'args_hash')
    op.drop_column('actions', 'args_hash')
