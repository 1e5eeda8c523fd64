"""beat_schedules: the schedule definitions beat fires by, stored when it starts

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 22:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'beat_schedules',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('definitions', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('stored_by', sa.Text(), nullable=False),
        sa.Column(
            'stored_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_beat_schedules')),
    )


def downgrade() -> None:
    op.drop_table('beat_schedules')
