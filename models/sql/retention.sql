-- Retention (pipeline/runs/retention.py): its first stage compacts a finished run's record
-- (pipeline/runs/redaction.py: the fields its agent declares personal and the bulky
-- intermediate outputs go; its outcome, decisions, approvals, costs, open obligations and owed
-- webhooks stay), its second deletes old compact records (pipeline/runs/deletion.py).
-- The caller holds the run's row lock. `redacted`: what a wholly redacted JSON column holds;
-- `open`: the action states of an open obligation, `owed`: a webhook's states while it is
-- owed (both from pipeline/runs/redaction.py).
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: redact_run
-- The run's input, state and result as compaction keeps them (`input`, `state`, `result`:
-- made in Python without the declared personal fields); its error (the outcome of a failed
-- run) stays. Its notify_url goes, unless a webhook is still owed to it.
UPDATE runs
   SET input = %(input)s,
       state = %(state)s,
       result = %(result)s,
       notify_url = CASE WHEN EXISTS (SELECT 1 FROM actions w
                                       WHERE w.run_id = runs.id AND w.kind = 'webhook'
                                         AND w.state = ANY(CAST(%(owed)s AS text[])))
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
-- The settled actions of `ids` keep their arguments and results without the declared personal
-- fields (`args`, `results`: made in Python, one an action); their state, decision, who
-- decided, errors and notes (the key decisions) stay. An action that became an open
-- obligation meanwhile is left for the next compaction after it settles. (A webhook is not
-- here: redact_run_events deletes the settled ones, and an owed one keeps the bytes it sends.)
UPDATE actions
   SET args = redacted.args,
       result = redacted.result,
       compacted_at = now(),
       updated_at = now()
  FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(args)s AS jsonb[]), CAST(%(results)s AS jsonb[]))
       AS redacted(id, args, result)
 WHERE actions.id = redacted.id
   AND NOT actions.state = ANY(CAST(%(open)s AS text[]))
;

-- name: redact_run_events
-- The payloads of the events that started the run; its progress feed and its settled
-- webhooks served people while the run was live: the outlines and the run row are its
-- record now.
WITH started AS (
    UPDATE events SET payload = %(redacted)s, updated_at = now() WHERE run_id = %(run_id)s
), feed AS (
    DELETE FROM run_events WHERE run_id = %(run_id)s
)
DELETE FROM actions
 WHERE run_id = %(run_id)s AND kind = 'webhook' AND NOT state = ANY(CAST(%(owed)s AS text[]))
;

-- name: delete_artifact_contents
-- The run's artifacts lose their contents; the rows stay, with deleted_at, as the record of
-- what existed (name, size, hash).
UPDATE artifacts SET content = NULL, deleted_at = now()
 WHERE run_id = %(run_id)s AND deleted_at IS NULL
;

-- name: delete_run
-- Retention's last stage (pipeline/runs/deletion.py, the run's row locked before): one old
-- compact record goes. run_events and alerts have no foreign key to runs (see
-- models/run_event.py) and go here; the journal, actions (webhooks too), their audit,
-- artifacts and takeovers go by ON DELETE CASCADE; schedule fires and events keep their de-duplication rows
-- with run_id NULL.
WITH events AS (
    DELETE FROM run_events WHERE run_id = %(run_id)s
), alerted AS (
    DELETE FROM alerts WHERE subject = 'run:' || CAST(%(run_id)s AS text)
)
DELETE FROM runs WHERE id = %(run_id)s
;

-- name: delete_batch_if_empty
-- A batch whose last run retention deleted goes too, with its feed, webhooks and alerts.
WITH gone AS (
    DELETE FROM batches b
     WHERE b.id = %(batch_id)s AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.batch_id = b.id)
    RETURNING b.id
), events AS (
    DELETE FROM run_events WHERE batch_id IN (SELECT id FROM gone)
), notified AS (
    DELETE FROM actions WHERE kind = 'webhook' AND batch_id IN (SELECT id FROM gone)
)
DELETE FROM alerts WHERE subject IN (SELECT 'batch:' || id FROM gone)
;
