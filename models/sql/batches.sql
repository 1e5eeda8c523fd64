-- Batches: their stops, their join and their end. pipeline/statements.py runs them in the
-- caller's transaction.
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: stop_batch
-- A cap stops the rest of the batch (pipeline/engine/budgets.py): its running children see it
-- at their next check; fail_parked_children ends the parked ones. No row: it was not running.
UPDATE batches
   SET status = 'stopped', stop_reason = %(reason)s, finished_at = now(), updated_at = now()
 WHERE id = %(batch_id)s AND status = 'running'
RETURNING id
;

-- name: stop_night_batches
-- The nightly cap stops every running batch created in the night's window.
UPDATE batches
   SET status = 'stopped', stop_reason = %(reason)s, finished_at = now(), updated_at = now()
 WHERE created_at >= %(starts)s AND created_at < %(ends)s AND status = 'running'
RETURNING id
;

-- name: fail_parked_children
-- The parked children of batches a cap stopped end here: nothing else would move them.
UPDATE runs
   SET status = 'failed', stop_reason = %(reason)s, finished_at = now(), wake_at = NULL,
       error = %(message)s, updated_at = now()
 WHERE batch_id = ANY(CAST(%(batch_ids)s AS text[]))
   AND status IN ('waiting', 'needs_attention')
RETURNING id
;
