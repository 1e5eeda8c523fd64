-- Webhooks: completion webhooks and alerts' webhooks are actions of kind `webhook`
-- (models/action.py), recorded by the status triggers (schema.sql) in the transaction of the
-- transition they announce, or with their alert (actions.sql record_action). Their states
-- change through actions.sql action_state and confirm_action like a tool's action; what is
-- theirs alone is here: no step holds them, so a sender claims the row itself (a fence and a
-- lease, as a step claims a run), and a failed attempt is tried again on a schedule.
-- pipeline/runs/notifications.py owes and dispatches them, pipeline/delivery/ sends them.
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: raise_alert
-- One alert per kind and subject, however many runs trip it (pipeline/engine/budgets.py), in
-- the caller's fenced transaction. No row: raised already.
INSERT INTO alerts (kind, subject, message)
VALUES (%(kind)s, %(subject)s, %(message)s)
ON CONFLICT (kind, subject) DO NOTHING
RETURNING id
;

-- name: dispatch_new_webhooks
-- The webhooks this transaction's own transitions recorded: their first delivery task goes
-- after the commit.
UPDATE actions SET dispatched_at = now()
 WHERE kind = 'webhook' AND state IN ('intended', 'attempted', 'outcome_unknown')
   AND dispatched_at IS NULL AND created_xid = pg_current_xact_id()::text::bigint
RETURNING idempotency_key, args->>'url' AS url
;

-- name: dispatch_due_webhooks
-- The tick: every webhook owed and due that no sender holds and no recent task (within the
-- hand-off `grace`) is on its way to: retries whose time has come, a delivery whose sender
-- died (its claim expired), one whose task message was lost.
UPDATE actions SET dispatched_at = now()
 WHERE id IN (
    SELECT id FROM actions
     WHERE kind = 'webhook' AND state IN ('intended', 'attempted', 'outcome_unknown')
       AND next_attempt_at <= now()
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
       AND (dispatched_at IS NULL
            OR dispatched_at < now() - make_interval(secs => %(grace)s))
     ORDER BY next_attempt_at
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED)
RETURNING idempotency_key, args->>'url' AS url
;

-- name: claim_webhook
-- A sender takes the webhook for one attempt, if it is owed, due and nobody else holds it:
-- the fence moves on (a sender that lost its claim can record nothing) and the claim lasts
-- `lease` seconds. An attempt whose sender died before saving the reply may have arrived: its
-- outcome is unknown.
UPDATE actions
   SET fence = fence + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s),
       dispatched_at = NULL,
       state = CASE WHEN state = 'attempted' THEN 'outcome_unknown' ELSE state END,
       updated_at = now()
 WHERE idempotency_key = %(key)s AND kind = 'webhook'
   AND state IN ('intended', 'attempted', 'outcome_unknown')
   AND next_attempt_at <= now()
   AND (lease_expires_at IS NULL OR lease_expires_at < now())
RETURNING fence, state, idempotency_key, tool AS event, args, attempts, run_id, batch_id
;

-- name: webhook_not_delivered
-- An attempt that did not deliver, by the sender that still holds the claim: the webhook is
-- failed (refused, or out of attempts), or owed again in `retry_in` seconds, in the state its
-- outcome leaves it (intended: nothing can have arrived; outcome_unknown: it may have). The
-- reply's HTTP status, if any, is its result.
UPDATE actions
   SET state = %(state)s, result = %(result)s, error = %(error)s,
       next_attempt_at = now() + make_interval(secs => %(retry_in)s),
       lease_expires_at = NULL, updated_at = now()
 WHERE idempotency_key = %(key)s AND kind = 'webhook' AND fence = %(fence)s
;

-- name: put_off_receiver
-- The receiver failed: its other owed webhooks (same scheme://host:port as `url`,
-- pipeline/runs/outbound.py Target.receiver) wait `wait` seconds (jittered) for its probe,
-- instead of each being handed to a worker only to find it still backed off. SKIP LOCKED: a
-- row another sender is claiming or recording is its own (and two of these, from two workers
-- whose sends to one receiver failed together, never wait on each other).
UPDATE actions
   SET next_attempt_at = now() + make_interval(secs => %(wait)s * (1 + random() / 2)),
       error = CASE WHEN attempts = 0 THEN %(error)s ELSE error END, updated_at = now()
 WHERE id IN (
    SELECT id FROM actions
     WHERE kind = 'webhook' AND state IN ('intended', 'attempted', 'outcome_unknown')
       AND idempotency_key <> %(key)s
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
       AND lower(substring(args->>'url' from '^[^/?#]*//[^/?#]*'))
         = lower(substring(CAST(%(url)s AS text) from '^[^/?#]*//[^/?#]*'))
       AND next_attempt_at < now() + make_interval(secs => %(wait)s)
       FOR UPDATE SKIP LOCKED)
;

-- name: bring_back_receiver
-- The receiver answered its probe: its other owed webhooks, put off past it, are due now.
UPDATE actions SET next_attempt_at = now(), updated_at = now()
 WHERE id IN (
    SELECT id FROM actions
     WHERE kind = 'webhook' AND state IN ('intended', 'attempted', 'outcome_unknown')
       AND idempotency_key <> %(key)s
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
       AND lower(substring(args->>'url' from '^[^/?#]*//[^/?#]*'))
         = lower(substring(CAST(%(url)s AS text) from '^[^/?#]*//[^/?#]*'))
       AND next_attempt_at > now()
       FOR UPDATE SKIP LOCKED)
;
