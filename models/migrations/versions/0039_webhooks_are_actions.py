"""completion webhooks and alerts' webhooks are actions: the notifications table's rows move to
actions (kind `webhook`, run_id NULL for a batch's or an alert's about no run), with their keys,
states and attempts, so a webhook delivered before the upgrade is not sent again after it; the
status triggers record webhook actions, and the action feed trigger skips them

Revision ID: 0039
Revises: 0038
Create Date: 2026-12-04 17:30:00.000000

The functions and triggers are in models/sql/schema.sql.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from models.sql import apply_schema

revision: str = "0039"
down_revision: str | None = "0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OWED = "state IN ('intended', 'attempted', 'outcome_unknown')"
_DUE = f"kind = 'webhook' AND {_OWED}"

# A webhook keeps its key (what a receiver de-duplicates on), its state, attempts, claim and
# schedule; its url, event or alert, and the bytes it sent become its args, its HTTP status its
# result. A run that retention deleted left its rows behind (no foreign key then): run_id NULL.
_MOVE = """
INSERT INTO actions (id, idempotency_key, kind, run_id, batch_id, tool, service, args, state,
                     attempts, first_attempt_at, last_attempt_at, result, error,
                     requires_approval, approvers, fence, lease_expires_at, next_attempt_at,
                     dispatched_at, created_xid, created_at, updated_at)
SELECT gen_random_uuid(), n.idempotency_key, 'webhook',
       (SELECT r.id FROM runs r WHERE r.id = n.run_id), n.batch_id, n.event, 'webhook',
       jsonb_strip_nulls(jsonb_build_object('url', n.url, 'event_id', n.event_id,
                                            'alert_id', n.alert_id, 'body', n.body)),
       n.state, n.attempts, n.first_attempt_at, n.last_attempt_at,
       CASE WHEN n.response_status IS NOT NULL
            THEN jsonb_build_object('status', n.response_status) END,
       n.error, false, '[]', n.fence, n.lease_expires_at, n.next_attempt_at, n.dispatched_at,
       n.created_xid, n.created_at, n.updated_at
  FROM notifications n
"""

_CLASHES = """
SELECT n.idempotency_key FROM notifications n
  JOIN actions a ON a.idempotency_key = n.idempotency_key
 LIMIT 5
"""

_MOVE_BACK = """
INSERT INTO notifications (idempotency_key, event, run_id, batch_id, event_id, alert_id, url,
                           state, attempts, fence, lease_expires_at, next_attempt_at,
                           dispatched_at, created_xid, body, first_attempt_at, last_attempt_at,
                           response_status, error, created_at, updated_at)
SELECT idempotency_key, tool, run_id, batch_id, (args->>'event_id')::bigint,
       (args->>'alert_id')::bigint, args->>'url', state, attempts, fence, lease_expires_at,
       next_attempt_at, dispatched_at, created_xid, args->>'body', first_attempt_at,
       last_attempt_at, (result->>'status')::integer, error, created_at, updated_at
  FROM actions WHERE kind = 'webhook'
 ORDER BY created_at
"""

# The functions as 0038 left them (the older code's notifications table).
_PREVIOUS = """
CREATE OR REPLACE FUNCTION nightshift_run_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event_id bigint;
    finished boolean;
    waiting_batch record;
BEGIN
    IF TG_ARGV[0] = 'created' THEN
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'created',
            jsonb_build_object('agent', NEW.agent, 'status', NEW.status, 'batch_id', NEW.batch_id,
                               'deadline', NEW.deadline));
    ELSIF TG_ARGV[0] = 'claimed' THEN
        -- attempt counts the run's claims (one per step when nothing fails); step_attempt is
        -- this claim's attempt of its step: 1 + the failed attempts of the step on the row
        -- (the tick and the time bound record them before the next claim; a claim that takes
        -- the run from a holder records that failure in this UPDATE).
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'claimed',
            jsonb_build_object('step', NEW.step, 'attempt', NEW.attempt,
                               'worker', NEW.lease_owner, 'fence', NEW.fence,
                               'step_attempt', 1
                                   + CASE WHEN NEW.failed_step = NEW.step
                                          THEN jsonb_array_length(NEW.failures) ELSE 0 END));
    ELSE
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'status',
            jsonb_build_object('status', NEW.status, 'previous', OLD.status, 'step', NEW.step,
                               'waiting_on', NEW.waiting_on, 'wake_at', NEW.wake_at,
                               'stop_reason', NEW.stop_reason, 'error', left(NEW.error, 500)))
        RETURNING id INTO event_id;
        IF NEW.status IN ('waiting', 'needs_attention', 'succeeded', 'failed', 'cancelled') THEN
            PERFORM pg_notify('nightshift_run_settled', NEW.id::text);
        END IF;
        IF NEW.status IN ('succeeded', 'failed', 'cancelled', 'needs_attention')
           OR (NEW.status = 'waiting' AND split_part(NEW.waiting_on, ':', 1) = 'approval') THEN
            finished := NEW.status IN ('succeeded', 'failed', 'cancelled');
            IF NEW.notify_url IS NOT NULL THEN
                INSERT INTO notifications (idempotency_key, event, run_id, batch_id, event_id, url, state)
                VALUES ('run:' || NEW.id || CASE WHEN finished THEN ':finished' ELSE ':waiting:' || event_id END,
                        CASE WHEN finished THEN 'run.finished' ELSE 'run.waiting' END,
                        NEW.id, NEW.batch_id, event_id, NEW.notify_url, 'intended')
                ON CONFLICT (idempotency_key) DO NOTHING;
            END IF;
            IF NOT finished THEN
                SELECT b.id, b.notify_url INTO waiting_batch FROM batches b
                 WHERE b.notify_url IS NOT NULL
                   AND (b.id = NEW.batch_id OR (NEW.batch_id IS NULL AND b.synthesis_run_id = NEW.id));
                IF FOUND THEN
                    INSERT INTO notifications (idempotency_key, event, run_id, batch_id, event_id, url, state)
                    VALUES ('batch:' || CASE WHEN length(waiting_batch.id) <= 160 THEN waiting_batch.id
                                             ELSE md5(waiting_batch.id) END || ':waiting:' || event_id,
                            'batch.waiting', NEW.id, waiting_batch.id, event_id,
                            waiting_batch.notify_url, 'intended')
                    ON CONFLICT (idempotency_key) DO NOTHING;
                END IF;
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION nightshift_action_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_events (run_id, kind, data) VALUES (NEW.run_id, 'action',
        jsonb_build_object('key', NEW.idempotency_key, 'tool', NEW.tool, 'state', NEW.state,
                           'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
                           'attempts', NEW.attempts, 'decision', NEW.decision,
                           'decided_by', NEW.decided_by, 'resolution', NEW.resolution));
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION nightshift_batch_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event_id bigint;
BEGIN
    INSERT INTO run_events (batch_id, kind, data) VALUES (NEW.id, 'batch',
        jsonb_build_object('status', NEW.status,
                           'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
                           'stop_reason', NEW.stop_reason))
    RETURNING id INTO event_id;
    IF TG_OP = 'UPDATE' AND NEW.notify_url IS NOT NULL
       AND NEW.status IN ('succeeded', 'failed', 'stopped') THEN
        INSERT INTO notifications (idempotency_key, event, batch_id, event_id, url, state)
        VALUES ('batch:' || CASE WHEN length(NEW.id) <= 160 THEN NEW.id ELSE md5(NEW.id) END
                    || ':finished',
                'batch.finished', NEW.id, event_id, NEW.notify_url, 'intended')
        ON CONFLICT (idempotency_key) DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
"""


def upgrade() -> None:
    connection = op.get_bind()
    clashes = [row[0] for row in connection.exec_driver_sql(_CLASHES)]
    if clashes:  # a tool's action under a webhook's key: neither may be lost or merged
        raise RuntimeError(f"webhook keys already taken by tool actions: {clashes}")
    op.add_column(
        "actions",
        sa.Column("kind", sa.String(length=32), server_default="tool", nullable=False),
    )
    op.create_check_constraint("action_kind", "actions", "kind IN ('tool', 'webhook')")
    op.add_column("actions", sa.Column("batch_id", sa.String(length=200), nullable=True))
    op.add_column(
        "actions",
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "actions", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "actions",
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
    )
    op.add_column(
        "actions", sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "actions",
        sa.Column(
            "created_xid",
            sa.BigInteger(),
            server_default=sa.text("(pg_current_xact_id())::text::bigint"),
            nullable=False,
        ),
    )
    op.alter_column("actions", "run_id", existing_type=sa.Uuid(), nullable=True)
    op.create_index(
        "ix_actions_webhooks_due", "actions", ["next_attempt_at"], postgresql_where=sa.text(_DUE)
    )
    op.create_index(
        "ix_actions_batch_id", "actions", ["batch_id"],
        postgresql_where=sa.text("batch_id IS NOT NULL"),
    )  # fmt: skip
    apply_schema(connection)  # first: the moved rows are no step's progress (no feed event)
    connection.exec_driver_sql(_MOVE)
    op.drop_table("notifications")


def downgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column("batch_id", sa.String(length=200), nullable=True),
        sa.Column("event_id", sa.BigInteger(), nullable=True),
        sa.Column("alert_id", sa.BigInteger(), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True),
                  server_default=sa.text("now()"), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_xid", sa.BigInteger(),
                  server_default=sa.text("(pg_current_xact_id())::text::bigint"), nullable=False),
        sa.Column("body", sa.Text(), nullable=True),
        sa.Column("first_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notifications")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_notifications_idempotency_key")),
        sa.CheckConstraint(
            "state IN ('pending_approval', 'intended', 'attempted', 'outcome_unknown', "
            "'confirmed', 'failed', 'rejected', 'withdrawn')",
            name=op.f("ck_notifications_notification_state"),
        ),
    )  # fmt: skip
    op.create_index(
        "ix_notifications_due", "notifications", ["next_attempt_at"],
        postgresql_where=sa.text(_OWED),
    )  # fmt: skip
    op.create_index("ix_notifications_run_id", "notifications", ["run_id"])
    op.create_index(
        "ix_notifications_alert_id", "notifications", ["alert_id"], unique=True,
        postgresql_where=sa.text("alert_id IS NOT NULL"),
    )  # fmt: skip
    connection = op.get_bind()
    connection.exec_driver_sql(_PREVIOUS)
    connection.exec_driver_sql(_MOVE_BACK)
    connection.exec_driver_sql("DELETE FROM actions WHERE kind = 'webhook'")
    op.drop_index("ix_actions_batch_id", table_name="actions")
    op.drop_index("ix_actions_webhooks_due", table_name="actions")
    op.alter_column("actions", "run_id", existing_type=sa.Uuid(), nullable=False)
    for column in ("created_xid", "dispatched_at", "next_attempt_at", "lease_expires_at",
                   "fence", "batch_id"):  # fmt: skip
        op.drop_column("actions", column)
    op.drop_constraint(op.f("ck_actions_action_kind"), "actions", type_="check")
    op.drop_column("actions", "kind")
