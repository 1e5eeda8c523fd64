"""actions.compacted_at: when retention dropped an action's personal data. Compaction used to
replace a settled action's whole arguments with {"redacted": true} and found the ones left to
do by that value; it now drops only the fields the agent declares personal, so the arguments
no longer say whether it happened. Actions redacted the old way are marked done.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-04 17:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("actions", sa.Column("compacted_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        """UPDATE actions SET compacted_at = updated_at WHERE args = '{"redacted": true}'::jsonb"""
    )


def downgrade() -> None:
    op.drop_column("actions", "compacted_at")
