-- Bulk operations (pipeline/runs/bulk.py): an operation and the items it matched, written
-- once at creation; then one small transaction an item, which marks the item done and applies
-- it (a cancel, a retry, a decision: their own statements) together, so an item is applied
-- once, or not at all when its transaction dies with its worker.
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: create_bulk_operation
-- The operation and its items in one statement: the run ids (and, for decisions, the action
-- keys) as arrays, one a column, in the order they were matched. Its lease starts now: if no
-- worker ever takes the operation's task, the tick sends it again once the lease passed.
WITH operation AS (
    INSERT INTO bulk_operations (id, kind, filter, requested_by, via, note, total,
                                 lease_expires_at)
    VALUES (%(id)s, %(kind)s, %(filter)s, %(by)s, %(via)s, %(note)s,
            cardinality(CAST(%(run_ids)s AS uuid[])),
            now() + make_interval(secs => CAST(%(lease)s AS float8)))
    RETURNING id
)
INSERT INTO bulk_items (operation_id, position, run_id, action_key)
SELECT operation.id, item.n - 1, item.run_id, item.action_key
  FROM operation,
       unnest(CAST(%(run_ids)s AS uuid[]), CAST(%(action_keys)s AS text[]))
       WITH ORDINALITY AS item(run_id, action_key, n)
;

-- name: hold_bulk_operation
-- A worker takes the operation up (its task, or the tick's re-send): the lease is renewed.
-- No row: finished already, or no such operation.
UPDATE bulk_operations
   SET lease_expires_at = now() + make_interval(secs => CAST(%(lease)s AS float8))
 WHERE id = %(id)s AND finished_at IS NULL
RETURNING kind, requested_by, via, note
;

-- name: take_bulk_item
-- The first item not done, marked done: the first statement of the item's transaction, whose
-- commit applies it. Not SKIP LOCKED: a second worker on the same operation (a re-send while
-- the first was slow) waits for the first's item instead of overtaking it; once that commits,
-- the row no longer qualifies and the second finds none this time (it ends; the first goes on).
UPDATE bulk_items
   SET done_at = now()
 WHERE (operation_id, position) = (
        SELECT operation_id, position FROM bulk_items
         WHERE operation_id = %(id)s AND done_at IS NULL
         ORDER BY position
         LIMIT 1
           FOR UPDATE)
RETURNING position, run_id, action_key
;

-- name: record_bulk_item
-- What applying the item did, in its transaction; the operation's lease is renewed with it.
WITH held AS (
    UPDATE bulk_operations
       SET lease_expires_at = now() + make_interval(secs => CAST(%(lease)s AS float8))
     WHERE id = %(id)s AND finished_at IS NULL
)
UPDATE bulk_items SET outcome = %(outcome)s, detail = %(detail)s
 WHERE operation_id = %(id)s AND position = %(position)s
;

-- name: finish_bulk_operation
-- Every item done: the operation is finished. No row: items remain (another worker holds
-- one), or it was finished already.
UPDATE bulk_operations SET finished_at = now(), lease_expires_at = NULL
 WHERE id = %(id)s AND finished_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM bulk_items WHERE operation_id = %(id)s AND done_at IS NULL)
RETURNING id
;

-- name: take_lost_bulk_operations
-- The tick: unfinished operations whose lease passed (their worker died, or their task was
-- lost), given a new lease and sent again. SKIP LOCKED: a row an item's transaction holds is
-- being worked on.
UPDATE bulk_operations
   SET lease_expires_at = now() + make_interval(secs => CAST(%(lease)s AS float8))
 WHERE id IN (SELECT id FROM bulk_operations
               WHERE finished_at IS NULL AND lease_expires_at < now()
               ORDER BY lease_expires_at
               LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED)
RETURNING id
;
