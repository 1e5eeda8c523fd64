"""agent versions on runs: the one a run started under, the one its last step ran under, and
the one a person allowed it to go on under

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01 22:30:00.000000

Runs started before this have no version (NULL): their next step records the one it runs
under, without applying the agent's on_version_change (nothing says they changed).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0021'
down_revision: str | None = '0020'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ('agent_version', 'running_version', 'allowed_version')


def upgrade() -> None:
    for name in _COLUMNS:
        op.add_column('runs', sa.Column(name, sa.String(length=80), nullable=True))


def downgrade() -> None:
    for name in reversed(_COLUMNS):
        op.drop_column('runs', name)
