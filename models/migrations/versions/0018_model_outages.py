"""model_outages: one row per model provider found down, its one probe and its recovery

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 22:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0018'
down_revision: str | None = '0017'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'model_outages',
        sa.Column('model', sa.String(length=200), nullable=False),
        sa.Column('since', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_error', sa.Text(), nullable=False),
        sa.Column('probe_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('probes', sa.Integer(), nullable=False),
        sa.Column('probe_run_id', sa.Uuid(), nullable=True),
        sa.Column('probe_started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('probe_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('recovered_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.PrimaryKeyConstraint('model', name=op.f('pk_model_outages')),
    )


def downgrade() -> None:
    op.drop_table('model_outages')
