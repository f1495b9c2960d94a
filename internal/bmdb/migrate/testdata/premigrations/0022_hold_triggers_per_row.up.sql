-- shepherd: compatible-with-previous
-- The triggers that make a machine due when a backoff, a "check again
-- later" or a hold of it ends or moves earlier run once per changed row
-- instead of once per statement (issue 31). A statement-level trigger runs
-- for every statement that could change the table, however few rows it
-- changed: every batch of lease ends clears the backoffs and "check again
-- later" rows of its leases and every claim upserts the holds of machines
-- whose budget ran out, nearly always no row at all, and each of those
-- statements paid a PL/pgSQL call, its transition tables and a query of
-- them. Rows are changed on those tables one or a few at a time (a
-- failure, an operator's hold, a release), so a call per changed row costs
-- what the statement's call did there, and nothing where nothing changed.
-- What they write is what the statement-level triggers wrote: due now when
-- the row is deleted, due at the new end when the end moves earlier, for
-- the row's process (for every registered process when a hold is for all,
-- process ''). Binaries of the previous schema do not notice: the rows
-- written are the same.
CREATE FUNCTION shepherd_hold_row_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
    blocked TEXT;
    machine UUID;
    due TIMESTAMPTZ;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        -- A hold until released has no end (NULL); one that gets an end,
        -- or whose end moves earlier, comes due at that end.
        IF NEW.until IS NULL OR (OLD.until IS NOT NULL AND NEW.until >= OLD.until) THEN
            RETURN NULL;
        END IF;
        blocked := NEW.process;
        machine := NEW.machine_id;
        due := GREATEST(NEW.until, now());
    ELSE
        blocked := OLD.process;
        machine := OLD.machine_id;
        due := now();
    END IF;
    FOR p IN
        INSERT INTO work_due AS d (process, machine_id, due_at)
        SELECT r.process, machine, due
        FROM process_registry r
        WHERE (blocked = '' OR r.process = blocked)
          AND EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = machine)
        ORDER BY r.process
        ON CONFLICT (process, machine_id) DO UPDATE
        SET due_at = LEAST(d.due_at, excluded.due_at)
        WHERE d.due_at > excluded.due_at
        RETURNING d.process
    LOOP
        PERFORM pg_notify('shepherd_due', p);
    END LOOP;
    RETURN NULL;
END $$;

DROP TRIGGER shepherd_due_backoff_ended ON work_backoff;
DROP TRIGGER shepherd_due_not_before_ended ON work_not_before;
DROP TRIGGER shepherd_due_backoff_shortened ON work_backoff;
DROP TRIGGER shepherd_due_not_before_shortened ON work_not_before;
DROP TRIGGER shepherd_due_machine_hold_released ON machine_hold;
DROP TRIGGER shepherd_due_machine_hold_shortened ON machine_hold;

CREATE TRIGGER shepherd_due_backoff_ended AFTER DELETE ON work_backoff
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_not_before_ended AFTER DELETE ON work_not_before
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_backoff_shortened AFTER UPDATE ON work_backoff
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_not_before_shortened AFTER UPDATE ON work_not_before
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_machine_hold_released AFTER DELETE ON machine_hold
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_machine_hold_shortened AFTER UPDATE ON machine_hold
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
