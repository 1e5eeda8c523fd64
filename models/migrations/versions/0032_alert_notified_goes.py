"""alerts.notified goes: nothing read or wrote it since an alert's webhook became a
notification (its delivery state is the notification's), and alerts are now raised by a named
statement (models/sql/notifications.sql raise_alert) that names only the columns it sets

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-04 15:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_column("alerts", "notified")


def downgrade() -> None:
    # The older code set it false on every alert it raised and never changed it.
    op.add_column(
        "alerts",
        sa.Column("notified", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
