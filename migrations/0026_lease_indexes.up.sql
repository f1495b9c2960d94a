-- shepherd: compatible-with-previous
-- work loses its indexes by process and by session (issue 31). Every
-- claim inserts a row into work and every lease end deletes it, so each
-- index of work is written once per lease, on the serial path of a
-- process's claims. work holds the leases in flight, as many as the
-- processes' workers, not a row per machine: the statements that read it
-- by process (a process's counts, its oldest lease, listings) or by
-- session (the release of a closed, expired or ended session's leases, a
-- few times an hour) read the small table whole for what the indexes
-- cost every lease. Claims and ends read it by machine, by its keys.
-- Binaries of the previous schema run the same statements.
DROP INDEX work_process_idx;
DROP INDEX work_session_idx;
