-- Statements only pipeline.testing runs, each on a database a test owns (one run's own copy of
-- the migrated template): never on a deployment's. Parameters are psycopg's (%(name)s).

-- name: clock_moved_by
-- How far the next move_clock_back moves the clock, for this transaction only.
SELECT set_config('nightshift.clock_moved_by', %(by)s, true);

-- name: move_clock_back
-- A test's clock moving forward (pipeline.testing's AgentRun.advance): every stored time of
-- the database made older by clock_moved_by. Every check of time compares a stored time with
-- now(), in PostgreSQL or in Python (timers, leases, deadlines, key retention, waits), so this
-- is the same as both clocks moving forward, with no clock in the code to move. UPDATE OF a
-- time fires none of the triggers (they are on status, fence and inserts). The one time the
-- engine keeps in JSON moves too: a timer's journaled wake time (`timer:<tool_use_id>`,
-- engine/timers.py), which its replay compares with now(). No parameters.
DO $$
DECLARE
    moved record;
BEGIN
    FOR moved IN
        SELECT c.table_name,
               string_agg(quote_ident(c.column_name) || ' = ' || quote_ident(c.column_name)
                          || ' - current_setting(''nightshift.clock_moved_by'')::interval',
                          ', ') AS sets
          FROM information_schema.columns c
          JOIN information_schema.tables t USING (table_schema, table_name)
         WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
           AND c.data_type IN ('timestamp with time zone', 'timestamp without time zone')
           AND c.is_generated = 'NEVER'
         GROUP BY c.table_name
    LOOP
        EXECUTE 'UPDATE ' || quote_ident(moved.table_name) || ' SET ' || moved.sets;
    END LOOP;
    UPDATE journal
       SET payload = jsonb_set(payload, '{wake_at}', to_jsonb(
               (payload ->> 'wake_at')::timestamptz
               - current_setting('nightshift.clock_moved_by')::interval))
     WHERE starts_with(key, 'timer:') AND payload ? 'wake_at';
END
$$;

-- name: empty_run_database
-- A run's database as its template left it, for the next run: every row deleted (the
-- template's tables are empty) and every sequence counting from 1 again; the migrations'
-- record stays. DELETE, not TRUNCATE: a run fills a few tables with a few rows, and TRUNCATE
-- makes new files for every table it names (and CASCADE names nearly all). A row another one
-- still refers to is deleted in a later pass. No parameters.
DO $$
DECLARE
    found record;
    passes int := 0;
    left_over boolean;
BEGIN
    LOOP
        left_over := false;
        FOR found IN
            SELECT tablename FROM pg_tables
             WHERE schemaname = current_schema() AND tablename <> 'alembic_version'
        LOOP
            BEGIN
                EXECUTE 'DELETE FROM ' || quote_ident(found.tablename);
            EXCEPTION WHEN foreign_key_violation THEN
                left_over := true;
            END;
        END LOOP;
        EXIT WHEN NOT left_over;
        passes := passes + 1;
        IF passes > 20 THEN
            RAISE EXCEPTION 'rows that refer to each other in a cycle: cannot empty the database';
        END IF;
    END LOOP;
    PERFORM setval(quote_ident(sequencename)::regclass, 1, false)
       FROM pg_sequences WHERE schemaname = current_schema();
END
$$;
