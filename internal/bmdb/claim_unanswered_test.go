package bmdb_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
)

// A claim whose COMMIT goes unanswered but which the server committed (a
// primary killed while it waits for its synchronous standby keeps the
// commit through crash recovery) leaves no lease that no worker runs
// under: the claimer ends it, Canceled, with the cause saying why.
//
// The test reproduces the fault on a private server: a synchronous standby
// that never comes makes the claim's COMMIT wait once it is flushed, and
// terminating that backend then (as a kill would) commits it locally while
// the client only sees its connection end.
func TestClaimWithUnansweredCommitLeavesNoLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: filepath.Join(t.TempDir(), "pg"), Fast: true, Logf: t.Logf})
	if err != nil {
		t.Fatalf("starting PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	if err := c.CreateDatabase(ctx, "bmdb", "template0"); err != nil {
		t.Fatal(err)
	}
	dsn := c.DSN("bmdb")
	if err := migrate.MigrateUp(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	// Every commit is local, but for the claim's, which the trigger makes
	// wait for a standby named "nobody".
	for _, q := range []string{
		`ALTER SYSTEM SET synchronous_commit = 'local'`,
		`ALTER SYSTEM SET synchronous_standby_names = 'nobody'`,
		`SELECT pg_reload_conf()`,
		`CREATE FUNCTION test_wait_for_standby() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN PERFORM set_config('synchronous_commit', 'on', true); RETURN NULL; END $$`,
		`CREATE TRIGGER test_wait_for_standby AFTER INSERT ON work
		 FOR EACH STATEMENT EXECUTE FUNCTION test_wait_for_standby()`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	waitFor(t, "the server to read synchronous_standby_names", func() bool {
		var names string
		err := admin.QueryRow(ctx, `SELECT setting FROM pg_settings WHERE name = 'synchronous_standby_names'`).Scan(&names)
		return err == nil && names == "nobody"
	})

	e := openEnv(t, dsn, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	m := e.addMachines(1)[0]

	type result struct {
		leases []*bmdb.Lease
		err    error
	}
	done := make(chan result, 1)
	go func() {
		register(t, s, agentStart, bmdb.ProvidedCandidates())
		w, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: 1})
		done <- result{w, err}
	}()
	var pid int
	waitFor(t, "the claim's COMMIT to wait for the standby", func() bool {
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&pid)
		return err == nil
	})
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the claim did not return within a minute of its connection's end")
	}
	if r.err == nil {
		t.Fatalf("the claim returned %d leases without error; its COMMIT had no answer", len(r.leases))
	}
	t.Logf("claim: %v", r.err)

	if n := e.leaseCount(agentStart); n != 0 {
		t.Errorf("%d leases held after the unanswered claim, want 0", n)
	}
	h := e.history(m)
	if got := bmdbtest.Events(h); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted, bmdb.EventCanceled}) {
		t.Fatalf("history %v, want Started then Canceled", got)
	}
	if cause := h[1].Cause; cause == "" {
		t.Errorf("the Canceled event has no cause")
	}
	if _, err := bmdbtest.AuditLeases(h, bmdbtest.GroupsOf(agentStart)); err != nil {
		t.Errorf("audit: %v", err)
	}

	// The machine is due again, and claimed as usual once commits are.
	if _, err := admin.Exec(ctx, `DROP TRIGGER test_wait_for_standby ON work`); err != nil {
		t.Fatal(err)
	}
	w := waitWork(t, s, agentStart, 30*time.Second)
	if w.Machine != m {
		t.Fatalf("claimed %s, want %s", w.Machine, m)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// The undo of a claim ends only leases its own transaction wrote, and only
// once it committed: a lease another claim took is left alone, and so is
// a machine whose claim aborted.
func TestUndoClaimFences(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	ms := e.addMachines(1)
	w := claim(t, s, agentStart)

	// A transaction that committed, but inserted no lease.
	var committed, aborted string
	if err := e.raw.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&committed); err != nil {
		t.Fatal(err)
	}
	tx, err := e.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&aborted); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, xid := range []string{committed, aborted} {
		s.UndoClaim(ctx, agentStart, ms, xid)
		if n := e.leaseCount(agentStart); n != 1 {
			t.Fatalf("undo of transaction %s (not the lease's) left %d leases, want 1", xid, n)
		}
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish after the undos: %v", err)
	}
	if got := bmdbtest.Events(e.history(ms[0])); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted, bmdb.EventFinished}) {
		t.Errorf("history %v, want Started, Finished", got)
	}
}

// waitFor polls cond until it holds, failing t after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
