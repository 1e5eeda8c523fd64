-- Retention (pipeline/runs/retention.py): its first stage compacts a finished run's record
-- (pipeline/runs/redaction.py: what the people it served gave and got goes; its outline, its
-- open obligations and its owed notifications stay), its second deletes old compact records
-- (pipeline/runs/deletion.py). The caller holds the run's row lock. `redacted`: what a
-- redacted JSON column holds, `redacted_text` a text column (NULL stays NULL: nothing was
-- there); `open`: the action states of an open obligation, `owed`: a notification's states
-- while it is owed (both from pipeline/runs/redaction.py).
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: redact_run
-- The run's input, state, result and error text; its notify_url too, unless a notification is
-- still owed to it.
UPDATE runs
   SET input = %(redacted)s,
       state = %(redacted)s,
       result = CASE WHEN result IS NULL THEN NULL ELSE %(redacted)s END,
       error = CASE WHEN error IS NULL THEN NULL ELSE %(redacted_text)s END,
       notify_url = CASE WHEN EXISTS (SELECT 1 FROM notifications n
                                       WHERE n.run_id = runs.id
                                         AND n.state = ANY(CAST(%(owed)s AS text[])))
                         THEN notify_url END,
       compacted_at = coalesce(compacted_at, now()),
       updated_at = now()
 WHERE id = %(run_id)s
;

-- name: outline_journal
-- The journal entries of `ids` keep only their outline (`payloads`, made in Python by
-- pipeline/runs/summaries.py outline: one a entry).
UPDATE journal
   SET payload = outlined.payload, compacted = true
  FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(payloads)s AS jsonb[])) AS outlined(id, payload)
 WHERE journal.id = outlined.id
;

-- name: redact_actions
-- The run's settled actions lose their arguments, results, errors and notes, and their audit
-- trail its notes; an open obligation keeps what a lookup, a resend or a person still needs.
WITH redacted AS (
    UPDATE actions
       SET args = %(redacted)s,
           result = CASE WHEN result IS NULL THEN NULL ELSE %(redacted)s END,
           error = CASE WHEN error IS NULL THEN NULL ELSE %(redacted_text)s END,
           note = CASE WHEN note IS NULL THEN NULL ELSE %(redacted_text)s END,
           updated_at = now()
     WHERE run_id = %(run_id)s
       AND NOT state = ANY(CAST(%(open)s AS text[]))
       AND args <> %(redacted)s
    RETURNING idempotency_key
)
UPDATE action_audit
   SET note = CASE WHEN note IS NULL THEN NULL ELSE %(redacted_text)s END
 WHERE action_key IN (SELECT idempotency_key FROM redacted)
;

-- name: redact_run_events
-- The payloads of the events that started the run; its progress feed and its settled
-- notifications served people while the run was live: the outlines and the run row are its
-- record now.
WITH started AS (
    UPDATE events SET payload = %(redacted)s, updated_at = now() WHERE run_id = %(run_id)s
), feed AS (
    DELETE FROM run_events WHERE run_id = %(run_id)s
)
DELETE FROM notifications
 WHERE run_id = %(run_id)s AND NOT state = ANY(CAST(%(owed)s AS text[]))
;

-- name: delete_artifact_contents
-- The run's artifacts lose their contents; the rows stay, with deleted_at, as the record of
-- what existed (name, size, hash).
UPDATE artifacts SET content = NULL, deleted_at = now()
 WHERE run_id = %(run_id)s AND deleted_at IS NULL
;

-- name: delete_run
-- Retention's last stage (pipeline/runs/deletion.py, the run's row locked before): one old
-- compact record goes. run_events, notifications and alerts have no foreign key to runs (see
-- models/run_event.py) and go here; the journal, actions, their audit, artifacts and
-- takeovers go by ON DELETE CASCADE; schedule fires and events keep their de-duplication rows
-- with run_id NULL.
WITH events AS (
    DELETE FROM run_events WHERE run_id = %(run_id)s
), notified AS (
    DELETE FROM notifications WHERE run_id = %(run_id)s
), alerted AS (
    DELETE FROM alerts WHERE subject = 'run:' || CAST(%(run_id)s AS text)
)
DELETE FROM runs WHERE id = %(run_id)s
;

-- name: delete_batch_if_empty
-- A batch whose last run retention deleted goes too, with its feed, notifications and alerts.
WITH gone AS (
    DELETE FROM batches b
     WHERE b.id = %(batch_id)s AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.batch_id = b.id)
    RETURNING b.id
), events AS (
    DELETE FROM run_events WHERE batch_id IN (SELECT id FROM gone)
), notified AS (
    DELETE FROM notifications WHERE batch_id IN (SELECT id FROM gone)
)
DELETE FROM alerts WHERE subject IN (SELECT 'batch:' || id FROM gone)
;
