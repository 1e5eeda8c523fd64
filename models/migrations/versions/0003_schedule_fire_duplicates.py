"""schedule fire duplicates and update times

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 12:07:54.093544
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('events', sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False))
    op.add_column('schedule_fires', sa.Column('duplicates', sa.Integer(), server_default=sa.text('0'), nullable=False))
    op.add_column('schedule_fires', sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False))


def downgrade() -> None:
    op.drop_column('schedule_fires', 'updated_at')
    op.drop_column('schedule_fires', 'duplicates')
    op.drop_column('events', 'updated_at')
