"""functions and triggers from models/sql/schema.sql, their one current definition

Revision ID: 0024
Revises: 0021
Create Date: 2026-12-02 07:00:00.000000

From here on schema.sql is the truth and migrations are its history: 0010 and 0011 created
these definitions inline; this migration applies the file, which holds the same definitions
(only the layout of their bodies changed), so nothing behaves differently. A later change to
schema.sql comes with its own migration that calls apply_schema again, and whose downgrade
restores the previous text.
"""

from collections.abc import Sequence

from alembic import op

from models.sql import apply_schema

revision: str = '0024'
down_revision: str | None = '0021'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_schema(op.get_bind())


def downgrade() -> None:
    # 0011's definitions are the same functions and triggers: nothing to restore.
    pass
