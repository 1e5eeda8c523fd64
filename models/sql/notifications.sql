-- Completion webhooks and alerts (pipeline/runs/notifications.py owes and dispatches them,
-- pipeline/delivery/ sends them). The completion rows themselves are written by the status
-- triggers (schema.sql) in the transaction of the transition, so none is lost; each row
-- follows the action protocol's states (models/notification.py).
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: raise_alert
-- One alert per kind and subject, however many runs trip it (pipeline/engine/budgets.py), in
-- the caller's fenced transaction. No row: raised already.
INSERT INTO alerts (kind, subject, message)
VALUES (%(kind)s, %(subject)s, %(message)s)
ON CONFLICT (kind, subject) DO NOTHING
RETURNING id
;

-- name: owe_alert
-- An alert's webhook, owed in the alert's own transaction, keyed `alert:<id>`, to the
-- operator's NIGHTSHIFT_ALERT_WEBHOOK_URL; with the run or batch it is about, if any, so the
-- row goes with them when they are deleted.
INSERT INTO notifications (idempotency_key, event, alert_id, run_id, batch_id, url, state)
VALUES (%(key)s, 'alert', %(alert_id)s, %(run_id)s, %(batch_id)s, %(url)s, 'intended')
ON CONFLICT (idempotency_key) DO NOTHING
;

-- name: dispatch_new_notifications
-- The notifications this transaction's own transitions wrote: their first delivery task goes
-- after the commit.
UPDATE notifications SET dispatched_at = now()
 WHERE state IN ('intended', 'attempted', 'outcome_unknown') AND dispatched_at IS NULL
   AND created_xid = pg_current_xact_id()::text::bigint
RETURNING id, url
;

-- name: dispatch_due_notifications
-- The tick: every notification owed and due that no sender holds and no recent task (within
-- the hand-off `grace`) is on its way to: retries whose time has come, a delivery whose sender
-- died (its claim expired), one whose task message was lost.
UPDATE notifications SET dispatched_at = now()
 WHERE id IN (
    SELECT id FROM notifications
     WHERE state IN ('intended', 'attempted', 'outcome_unknown') AND next_attempt_at <= now()
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
       AND (dispatched_at IS NULL
            OR dispatched_at < now() - make_interval(secs => %(grace)s))
     ORDER BY next_attempt_at
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED)
RETURNING id, url
;

-- name: claim_notification
-- A sender takes the notification for one attempt, if it is owed, due and nobody else holds
-- it: the fence moves on (a sender that lost its claim can record nothing) and the claim lasts
-- `lease` seconds. An attempt whose sender died before saving the reply may have arrived: its
-- outcome is unknown.
UPDATE notifications
   SET fence = fence + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s),
       dispatched_at = NULL,
       state = CASE WHEN state = 'attempted' THEN 'outcome_unknown' ELSE state END,
       updated_at = now()
 WHERE id = %(id)s
   AND state IN ('intended', 'attempted', 'outcome_unknown')
   AND next_attempt_at <= now()
   AND (lease_expires_at IS NULL OR lease_expires_at < now())
RETURNING id, fence, state, idempotency_key, event, url, body, attempts, run_id,
          batch_id, event_id, alert_id
;

-- name: notification_attempted
-- Saved before the POST, with the bytes every attempt sends. No row: another sender took the
-- notification over meanwhile.
UPDATE notifications
   SET state = 'attempted', attempts = attempts + 1, body = %(body)s,
       first_attempt_at = coalesce(first_attempt_at, now()), last_attempt_at = now(),
       updated_at = now()
 WHERE id = %(id)s AND fence = %(fence)s
;

-- name: record_notification
-- The attempt's outcome, by the sender that still holds the claim; `retry_in` seconds to the
-- next attempt if one is owed.
UPDATE notifications
   SET state = %(state)s, response_status = %(status)s, error = %(error)s,
       next_attempt_at = now() + make_interval(secs => %(retry_in)s),
       lease_expires_at = NULL, updated_at = now()
 WHERE id = %(id)s AND fence = %(fence)s
;

-- name: put_off_receiver
-- The receiver failed: its other owed notifications (same scheme://host:port as `url`,
-- pipeline/runs/outbound.py Target.receiver) wait `wait` seconds (jittered) for its probe,
-- instead of each being handed to a worker only to find it still backed off. SKIP LOCKED: a
-- row another sender is claiming or recording is its own (and two of these, from two workers
-- whose sends to one receiver failed together, never wait on each other).
UPDATE notifications
   SET next_attempt_at = now() + make_interval(secs => %(wait)s * (1 + random() / 2)),
       error = CASE WHEN attempts = 0 THEN %(error)s ELSE error END, updated_at = now()
 WHERE id IN (
    SELECT id FROM notifications
     WHERE state IN ('intended', 'attempted', 'outcome_unknown') AND id <> %(id)s
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
       AND lower(substring(url from '^[^/?#]*//[^/?#]*'))
         = lower(substring(CAST(%(url)s AS text) from '^[^/?#]*//[^/?#]*'))
       AND next_attempt_at < now() + make_interval(secs => %(wait)s)
       FOR UPDATE SKIP LOCKED)
;

-- name: bring_back_receiver
-- The receiver answered its probe: its other owed notifications, put off past it, are due now.
UPDATE notifications SET next_attempt_at = now(), updated_at = now()
 WHERE id IN (
    SELECT id FROM notifications
     WHERE state IN ('intended', 'attempted', 'outcome_unknown') AND id <> %(id)s
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
       AND lower(substring(url from '^[^/?#]*//[^/?#]*'))
         = lower(substring(CAST(%(url)s AS text) from '^[^/?#]*//[^/?#]*'))
       AND next_attempt_at > now()
       FOR UPDATE SKIP LOCKED)
;
