"""runs.compacted_at: when retention redacted a run, the start of its deletion window

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0015'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('compacted_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_runs_compacted_at', 'runs', ['compacted_at'], unique=False,
                    postgresql_where=sa.text('compacted_at IS NOT NULL'))


def downgrade() -> None:
    op.drop_index('ix_runs_compacted_at', table_name='runs',
                  postgresql_where=sa.text('compacted_at IS NOT NULL'))
    op.drop_column('runs', 'compacted_at')
