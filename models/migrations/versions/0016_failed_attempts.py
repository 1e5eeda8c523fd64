"""runs count the consecutive failed attempts of a step (poison runs stop)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 22:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('failed_step', sa.Integer(), nullable=True))
    op.add_column(
        'runs', sa.Column('failed_attempts', sa.Integer(), server_default='0', nullable=False)
    )
    op.add_column(
        'runs',
        sa.Column('failures', postgresql.JSONB(), server_default='[]', nullable=False),
    )
    op.add_column('runs', sa.Column('quarantine_fence', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for column in ('quarantine_fence', 'failures', 'failed_attempts', 'failed_step'):
        op.drop_column('runs', column)
