"""runs by creation time: the nightly cap sums every run of the night

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01 22:50:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = '0019'
down_revision: str | None = '0018'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index('ix_runs_created_at', 'runs', ['created_at'])


def downgrade() -> None:
    op.drop_index('ix_runs_created_at', table_name='runs')
