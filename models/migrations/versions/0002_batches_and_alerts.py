"""batches and alerts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 12:02:02.951207
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('alerts',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('subject', sa.String(length=200), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('notified', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alerts')),
    sa.UniqueConstraint('kind', 'subject', name=op.f('uq_alerts_kind_subject'))
    )
    op.create_table('batches',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('status', sa.Enum('running', 'synthesizing', 'succeeded', 'failed', 'stopped', name='batch_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('params', postgresql.JSONB(), nullable=False),
    sa.Column('token_cap', sa.BigInteger(), nullable=True),
    sa.Column('cost_cap_usd', sa.Numeric(precision=12, scale=4), nullable=True),
    sa.Column('synthesis_run_id', sa.Uuid(), nullable=True),
    sa.Column('stop_reason', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batches'))
    )
    op.create_foreign_key(
        op.f('fk_batches_synthesis_run_id_runs'), 'batches', 'runs', ['synthesis_run_id'], ['id'],
        ondelete='SET NULL',
    )
    op.create_foreign_key(op.f('fk_runs_batch_id_batches'), 'runs', 'batches', ['batch_id'], ['id'])


def downgrade() -> None:
    op.drop_constraint(op.f('fk_runs_batch_id_batches'), 'runs', type_='foreignkey')
    op.drop_constraint(op.f('fk_batches_synthesis_run_id_runs'), 'batches', type_='foreignkey')
    op.drop_table('batches')
    op.drop_table('alerts')
