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

-- name: create_batch
-- A batch, once (pipeline/runs/fanout.py): its children are created in the same transaction
-- (runs.sql create_runs). No row: the batch id exists already (the same slot fired twice).
INSERT INTO batches (id, name, status, params, token_cap, cost_cap_usd, tool_call_cap,
                     deadline, notify_url)
VALUES (%(batch_id)s, %(name)s, 'running', %(params)s, %(token_cap)s, %(cost_cap_usd)s,
        %(tool_call_cap)s, %(deadline)s, %(notify_url)s)
ON CONFLICT (id) DO NOTHING
RETURNING id
;

-- name: synthesis_started
-- Every child is done: the batch's synthesis run is recorded, and the batch synthesizes (or
-- stays stopped, its reason kept, when a cap stopped it: the synthesis is then partial). In the
-- transaction that holds the batch's row and created the synthesis run.
UPDATE batches SET synthesis_run_id = %(run_id)s, status = %(status)s, updated_at = now()
 WHERE id = %(batch_id)s
;

-- name: synthesis_finished
-- The batch ends with its synthesis (`status` succeeded or failed). Every run's finish runs
-- it; most often it matches no batch.
UPDATE batches SET status = %(status)s, finished_at = now(), updated_at = now()
 WHERE synthesis_run_id = %(run_id)s AND status = 'synthesizing'
;

-- name: cancel_batch
-- A person stops the batch (pipeline/runs/cancel.py): no synthesis starts for it any more; its
-- unfinished runs are then cancelled one by one. No row: it had ended or was stopped already.
UPDATE batches
   SET status = 'stopped', stop_reason = %(reason)s, finished_at = now(), updated_at = now()
 WHERE id = %(batch_id)s AND status NOT IN ('succeeded', 'failed', 'stopped')
RETURNING synthesis_run_id
;
