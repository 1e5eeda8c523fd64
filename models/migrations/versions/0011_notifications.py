"""completion webhooks: notify_url on runs and batches, and a notifications row written by the
status triggers in the transaction of each transition worth telling

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 13:00:00.000000

A run notifies when it finishes (`run:<id>:finished`) and when it starts waiting for a person:
an approval (waiting_on `approval:...`) or an unknown outcome (needs_attention), keyed
`run:<id>:waiting:<event id>`. A batch's notify_url hears of its end and of every wait for a
person among its runs (children and synthesis).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES = ('pending_approval', 'intended', 'attempted', 'outcome_unknown', 'confirmed', 'failed', 'rejected', 'withdrawn')

# A batch id of up to 200 characters would make a key too long: such ids are hashed.
_BATCH_KEY = "'batch:' || CASE WHEN length({id}) <= 160 THEN {id} ELSE md5({id}) END"

_RUN_NOTIFY = f"""
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
                    VALUES ({_BATCH_KEY.format(id='waiting_batch.id')} || ':waiting:' || event_id,
                            'batch.waiting', NEW.id, waiting_batch.id, event_id,
                            waiting_batch.notify_url, 'intended')
                    ON CONFLICT (idempotency_key) DO NOTHING;
                END IF;
            END IF;
        END IF;
"""

_BATCH_NOTIFY = f"""
    IF TG_OP = 'UPDATE' AND NEW.notify_url IS NOT NULL
       AND NEW.status IN ('succeeded', 'failed', 'stopped') THEN
        INSERT INTO notifications (idempotency_key, event, batch_id, event_id, url, state)
        VALUES ({_BATCH_KEY.format(id='NEW.id')} || ':finished', 'batch.finished', NEW.id,
                event_id, NEW.notify_url, 'intended')
        ON CONFLICT (idempotency_key) DO NOTHING;
    END IF;
"""


def _run_event_function(notify: bool) -> str:
    return f"""
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
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'claimed',
            jsonb_build_object('step', NEW.step, 'attempt', NEW.attempt,
                               'worker', NEW.lease_owner, 'fence', NEW.fence));
    ELSE
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'status',
            jsonb_build_object('status', NEW.status, 'previous', OLD.status, 'step', NEW.step,
                               'waiting_on', NEW.waiting_on, 'wake_at', NEW.wake_at,
                               'stop_reason', NEW.stop_reason, 'error', left(NEW.error, 500)))
        RETURNING id INTO event_id;
        IF NEW.status IN ('waiting', 'needs_attention', 'succeeded', 'failed', 'cancelled') THEN
            PERFORM pg_notify('nightshift_run_settled', NEW.id::text);
        END IF;
{_RUN_NOTIFY if notify else ""}
    END IF;
    RETURN NULL;
END $$;
"""


def _batch_event_function(notify: bool) -> str:
    return f"""
CREATE OR REPLACE FUNCTION nightshift_batch_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event_id bigint;
BEGIN
    INSERT INTO run_events (batch_id, kind, data) VALUES (NEW.id, 'batch',
        jsonb_build_object('status', NEW.status,
                           'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
                           'stop_reason', NEW.stop_reason))
    RETURNING id INTO event_id;
{_BATCH_NOTIFY if notify else ""}
    RETURN NULL;
END $$;
"""


def _execute(sql: str) -> None:
    """Straight to the driver: SQLAlchemy would read the keys' `:finished` as bind parameters."""
    op.get_bind().exec_driver_sql(sql)


def upgrade() -> None:
    op.add_column('runs', sa.Column('notify_url', sa.String(length=2000), nullable=True))
    op.add_column('batches', sa.Column('notify_url', sa.String(length=2000), nullable=True))
    op.create_table('notifications',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=False),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('run_id', sa.Uuid(), nullable=True),
    sa.Column('batch_id', sa.String(length=200), nullable=True),
    sa.Column('event_id', sa.BigInteger(), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('state', sa.Enum(*_STATES, name='notification_state', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('fence', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('dispatched_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_xid', sa.BigInteger(), server_default=sa.text('(pg_current_xact_id())::text::bigint'), nullable=False),
    sa.Column('body', sa.Text(), nullable=True),
    sa.Column('first_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('response_status', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notifications')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_notifications_idempotency_key'))
    )
    op.create_index('ix_notifications_due', 'notifications', ['next_attempt_at'], unique=False, postgresql_where=sa.text("state IN ('intended', 'attempted', 'outcome_unknown')"))
    op.create_index('ix_notifications_run_id', 'notifications', ['run_id'], unique=False)
    _execute(_run_event_function(notify=True))
    _execute(_batch_event_function(notify=True))


def downgrade() -> None:
    _execute(_batch_event_function(notify=False))
    _execute(_run_event_function(notify=False))
    op.drop_index('ix_notifications_run_id', table_name='notifications')
    op.drop_index('ix_notifications_due', table_name='notifications', postgresql_where=sa.text("state IN ('intended', 'attempted', 'outcome_unknown')"))
    op.drop_table('notifications')
    op.drop_column('batches', 'notify_url')
    op.drop_column('runs', 'notify_url')
