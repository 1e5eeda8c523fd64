"""a claim that takes a run from a holder records that failed attempt in its own UPDATE, so
the claimed event's step_attempt counts it from the row (no +1 for a takeover)

Revision ID: 0028
Revises: 0023
Create Date: 2026-12-03 09:00:00.000000

The function nightshift_run_event is in models/sql/schema.sql.
"""

from collections.abc import Sequence

from alembic import op

from models.sql import apply_schema

revision: str = '0028'
down_revision: str | None = '0023'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The function as 0025-0027 and 0023 had it: the older code records a takeover's failure after the
# claim's UPDATE, and the +1 counts it.
_PREVIOUS_FUNCTION = """
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
        -- (the tick and the time bound record them before the next claim) + 1 when this claim
        -- takes the run from a holder (the takeover records that failure after this UPDATE).
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'claimed',
            jsonb_build_object('step', NEW.step, 'attempt', NEW.attempt,
                               'worker', NEW.lease_owner, 'fence', NEW.fence,
                               'step_attempt', 1
                                   + CASE WHEN NEW.failed_step = NEW.step
                                          THEN jsonb_array_length(NEW.failures) ELSE 0 END
                                   + CASE WHEN OLD.lease_owner IS NOT NULL
                                           AND NEW.lease_owner IS NOT NULL THEN 1 ELSE 0 END));
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
"""


def upgrade() -> None:
    apply_schema(op.get_bind())


def downgrade() -> None:
    op.get_bind().exec_driver_sql(_PREVIOUS_FUNCTION)
