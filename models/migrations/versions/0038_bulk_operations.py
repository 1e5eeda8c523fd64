"""bulk operations (issue 34): an operation by filter (who, when, the filter, its kind) and
its items, the runs or pending approvals it matched, frozen at creation; each item is marked
done in the transaction that applies it

Revision ID: 0038
Revises: 0037
Create Date: 2026-12-04 17:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0038"
down_revision: str | None = "0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bulk_operations",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column(
            "kind",
            sa.Enum(
                "cancel",
                "retry",
                "approve",
                "reject",
                name="bulk_kind",
                native_enum=False,
                create_constraint=True,
                length=32,
            ),
            nullable=False,
        ),  # fmt: skip
        sa.Column("filter", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("via", sa.String(length=200), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),  # fmt: skip
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bulk_operations")),
    )
    op.create_index(
        "ix_bulk_operations_unfinished", "bulk_operations", ["lease_expires_at"],
        postgresql_where=sa.text("finished_at IS NULL"),
    )  # fmt: skip
    op.create_index("ix_bulk_operations_created_at", "bulk_operations", ["created_at"])
    op.create_table(
        "bulk_items",
        sa.Column("operation_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("action_key", sa.String(length=200), nullable=True),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["operation_id"],
            ["bulk_operations.id"],
            name=op.f("fk_bulk_items_operation_id_bulk_operations"),
            ondelete="CASCADE",
        ),  # fmt: skip
        sa.PrimaryKeyConstraint("operation_id", "position", name=op.f("pk_bulk_items")),
    )


def downgrade() -> None:
    op.drop_table("bulk_items")
    op.drop_index("ix_bulk_operations_created_at", table_name="bulk_operations")
    op.drop_index("ix_bulk_operations_unfinished", table_name="bulk_operations")
    op.drop_table("bulk_operations")
