-- shepherd: compatible-with-previous
-- shepherd: gate enforced-in-database
-- shepherd: incompatible-before 18: binaries before schema 18 ignore cancel requests, which the database cannot make binding on a lease in flight
--
-- The safety gates of migrations 0017 and 0018 (holds, per-machine
-- budgets, cancel requests) bind every binary, not only those that know
-- them (issue 54). Those migrations were expand steps, so a binary of an
-- older schema ran beside them and leased held machines, reset machines
-- whose budget was spent and ignored cancel requests.
--
-- Holds and budgets are checked again by the database for every lease
-- that a binary of this release did not judge: a claim of this release
-- (and of schemas 28 and 29) marks its leases machine_locked, and only a
-- lease without the mark (a binary before schema 28, a hand-written
-- statement) calls shepherd_lease_gates. The claim's own leases pay the
-- trigger's WHEN clause, no function call. A lease of a held machine is
-- not inserted (the trigger returns NULL: the older binary's claim leases
-- nothing there, and its due row leaves the table as for any machine it
-- does not lease; the hold's release brings it back). A lease of a
-- machine whose budget is spent is not inserted either: the machine is
-- held for the process (source budget) and Escalated is recorded, as a
-- claim of this release does. The budget is the strictest one that the
-- live replicas of this release recorded for the process (smallest N,
-- longest window, in process_registrants); while none runs, the older
-- binaries' leases are judged by holds only.
--
-- A cancel request cannot be made binding on a lease of a binary that
-- does not read work_cancel: the database can only refuse a lease, not
-- stop the work in flight under it. So binaries before schema 18, the
-- ones that do not read it, refuse to start on this schema (migrate up
-- records version 18 as not compatible with the binaries before it), and
-- 'migrate up', 'hold' and 'cancel' warn while sessions of binaries of an
-- older schema are live.
--
-- process_registrants gains what a live replica runs: its schema version
-- (NULL: a binary before this one, which does not write it) and the
-- process's per-machine budget (NULL: none). History retention keeps all
-- events within the longest budget window recorded here.
ALTER TABLE process_registrants
    ADD COLUMN schema_version INT,
    ADD COLUMN budget_n INT CHECK (budget_n > 0),
    ADD COLUMN budget_window_seconds DOUBLE PRECISION CHECK (budget_window_seconds > 0),
    ADD CHECK ((budget_n IS NULL) = (budget_window_seconds IS NULL));

CREATE FUNCTION shepherd_lease_gates() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n INT;
    window_seconds DOUBLE PRECISION;
    used BIGINT;
BEGIN
    -- Held for the process, or for every process: one probe of the key.
    PERFORM 1 FROM machine_hold h
    WHERE h.machine_id = NEW.machine_id AND h.process IN (NEW.process, '')
      AND (h.until IS NULL OR h.until > now());
    IF FOUND THEN
        RETURN NULL;
    END IF;
    -- The strictest budget the live replicas of this release run with:
    -- the process's rows of process_registrants, by its key.
    SELECT min(r.budget_n), max(r.budget_window_seconds) INTO n, window_seconds
    FROM process_registrants r JOIN sessions s ON s.session_id = r.session_id
    WHERE r.process = NEW.process AND r.budget_n IS NOT NULL AND s.session_deadline > now();
    IF n IS NULL THEN
        RETURN NEW;
    END IF;
    -- Started events of the process within the window since the last
    -- release of a hold of the machine for it (one for every process
    -- too), as a claim counts them: one read of the machine's events of
    -- the window by work_history_machine_idx (a release before the window
    -- excludes none of them).
    SELECT count(*) INTO used FROM (
        SELECT h.id, h.event, h.process,
               max(h.id) FILTER (WHERE h.event = 'Released' AND h.process IN (NEW.process, '')) OVER () AS released
        FROM work_history h
        WHERE h.machine_id = NEW.machine_id AND h."timestamp" > now() - make_interval(secs => window_seconds)
    ) e
    WHERE e.event = 'Started' AND e.process = NEW.process AND e.id > COALESCE(e.released, 0);
    IF used < n THEN
        RETURN NEW;
    END IF;
    INSERT INTO machine_hold AS mh (machine_id, process, reason, until, actor, source)
    VALUES (NEW.machine_id, NEW.process, 'budget exhausted', NULL, 'budget', 'budget')
    ON CONFLICT (machine_id, process) DO UPDATE
    SET reason = excluded.reason, until = NULL, held_at = now(), actor = excluded.actor,
        actor_role = excluded.actor_role, source = excluded.source;
    INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
    VALUES (NEW.machine_id, NEW.process, 'Escalated',
            format('budget exhausted: %s leases within %s; held until an operator releases it; judged by the database for a lease taken by a binary of an older schema',
                   n, make_interval(secs => window_seconds)),
            'budget', session_user);
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_lease_gates BEFORE INSERT ON work
    FOR EACH ROW WHEN (NEW.machine_locked IS NOT TRUE)
    EXECUTE FUNCTION shepherd_lease_gates();
