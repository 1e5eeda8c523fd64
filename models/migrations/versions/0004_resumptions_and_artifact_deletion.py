"""resumptions (takeovers, for the reliability metrics) and artifact deletion times (retention)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 14:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('resumptions',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Uuid(), nullable=False),
    sa.Column('cause', sa.Enum('lease_expired', 'no_message', name='resume_cause', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('lost_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('resumed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('fence', sa.BigInteger(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_resumptions_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_resumptions'))
    )
    op.create_index('ix_resumptions_run_id', 'resumptions', ['run_id'], unique=False)
    op.create_index('uq_resumptions_open_run_id', 'resumptions', ['run_id'], unique=True, postgresql_where=sa.text('resumed_at IS NULL'))
    op.add_column('artifacts', sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('artifacts', 'deleted_at')
    op.drop_index('uq_resumptions_open_run_id', table_name='resumptions', postgresql_where=sa.text('resumed_at IS NULL'))
    op.drop_index('ix_resumptions_run_id', table_name='resumptions')
    op.drop_table('resumptions')
