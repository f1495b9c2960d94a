package shepherdcli

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// The CLI never runs condition SQL read from the BMDB. A process_registry
// row changed in the database, to SQL that escapes its parentheses
// through an escape string (listing every machine, those in backoff too) or
// that ends another backend, makes `shepherd machines -process recovery
// -state eligible` refuse, saying the condition differs, with no backend
// ended and no machine listed; `shepherd condition` shows both texts,
// escaped. For a process the binary does not know, eligibility is
// unknown: the recorded text is shown, not run.
func TestCLINeverRunsRegistryConditionSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	env := replicatest.EnvWithoutDSN()

	// Four machines whose agents heartbeat: none eligible for Recovery,
	// two backing off from it.
	var ids []string
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		for _, name := range []string{"m-1", "m-2", "m-3", "m-4"} {
			id, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: name})
			if err != nil {
				return err
			}
			ids = append(ids, id.String())
			if err := tx.SetAgentStarted(ctx, id, []byte("key")); err != nil {
				return err
			}
			if err := tx.Heartbeat(ctx, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "test"})
	if err != nil {
		t.Fatal(err)
	}
	bmdbtest.Register(t, db, recovery.Process, bmdb.ProvidedCandidates())
	for range 2 {
		leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery.Process, Candidates: bmdb.ProvidedCandidates()})
		if err != nil {
			t.Fatal(err)
		}
		l := leases[0]
		if err := l.Fail(ctx, bmdb.Backoff{Initial: time.Hour}, "test: backing off"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Registered as this binary registers it (the claims above registered
	// another condition).
	if _, err := db.RegisterProcess(ctx, recovery.Process, recovery.Candidates(recovery.DefaultStartTimeout, recovery.DefaultHeartbeatTimeout), "test"); err != nil {
		t.Fatal(err)
	}

	eligible := func() (int, string, string) {
		t.Helper()
		return runShepherd(t, env, "machines", "-process", "recovery", "-state", "eligible", "-o", "json", "-bmdb_dsn", dsn)
	}
	code, out, errOut := eligible()
	if code != exitOK || !strings.Contains(errOut, "as the daemons evaluate it") || strings.TrimSpace(out) != "[]" {
		t.Fatalf("untouched registry: exit %d, stdout %s, stderr:\n%s", code, out, errOut)
	}

	raw, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(context.WithoutCancel(ctx))
	victim, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(context.WithoutCancel(ctx))
	pid := victim.PgConn().PID()
	setCondition := func(process, sql string) {
		t.Helper()
		if _, err := raw.Exec(ctx, `UPDATE process_registry SET condition_sql = $2 WHERE process = $1`, process, sql); err != nil {
			t.Fatal(err)
		}
	}

	for _, tampered := range []string{
		// Balanced to the old lexer, which took E'\'' for a string that
		// goes on: it escaped the parentheses, listing every machine.
		`E'\'' = '' ) OR true OR ( '' = E'\''`,
		// Balanced to any lexer; ran with the operator's role, it ended
		// another backend. The escape sequence is to be shown escaped.
		`pg_terminate_backend(` + strconv.FormatUint(uint64(pid), 10) + `) OR '` + "\x1b[2J" + `' = ''`,
	} {
		setCondition(recovery.Process.Name, tampered)
		code, out, errOut := eligible()
		if code == exitOK || !strings.Contains(errOut, "process recovery: the condition recorded in the BMDB differs from this binary's") || !strings.Contains(errOut, "does not run SQL read from the database") {
			t.Errorf("condition %q: exit %d, stderr:\n%s", tampered, code, errOut)
		}
		for _, id := range ids {
			if strings.Contains(out, id) {
				t.Errorf("condition %q: machine %s listed:\n%s", tampered, id, out)
			}
		}
		if err := victim.Ping(ctx); err != nil {
			t.Fatalf("condition %q: another backend was ended: %v", tampered, err)
		}
		// Listing every process's states refuses too.
		if code, _, errOut := runShepherd(t, env, "machines", "-bmdb_dsn", dsn); code == exitOK || !strings.Contains(errOut, "differs") {
			t.Errorf("condition %q: machines of every process: exit %d, stderr:\n%s", tampered, code, errOut)
		}
	}

	// shepherd condition shows both texts, escaped, and the difference.
	code, out, errOut = runShepherd(t, env, "condition", "recovery", "-bmdb_dsn", dsn)
	if code != exitOK || !strings.Contains(out, "DIFFERENT") || !strings.Contains(out, "pg_terminate_backend") || strings.Contains(out, "\x1b") {
		t.Errorf("shepherd condition recovery: exit %d, stdout:\n%q\nstderr:\n%s", code, out, errOut)
	}
	var shown conditionJSON
	code, out, _ = runShepherd(t, env, "condition", "recovery", "-o", "json", "-bmdb_dsn", dsn)
	if err := json.Unmarshal([]byte(out), &shown); err != nil || code != exitOK || shown.Same || shown.Binary == nil || shown.Recorded == nil ||
		!strings.Contains(shown.Recorded.SQL, "pg_terminate_backend") || shown.Binary.SQL != recovery.Candidates(time.Minute, time.Minute).SQL() {
		t.Errorf("shepherd condition -o json: exit %d, %v, %+v", code, err, shown)
	}

	// A process this binary does not know: its recorded SQL is not run,
	// its eligibility unknown.
	other := bmdb.Process{Name: "OtherFirmwareCheck", ExclusionGroup: "Other"}
	cand, err := bmdb.NewCandidates(bmdb.Condition{Name: "firmware", SQL: "true"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.RegisterProcess(ctx, other, cand, "another release"); err != nil {
		t.Fatal(err)
	}
	setCondition(other.Name, `pg_terminate_backend(`+strconv.FormatUint(uint64(pid), 10)+`)`)
	code, out, errOut = runShepherd(t, env, "machines", "-process", other.Name, "-state", "eligible", "-bmdb_dsn", dsn)
	if code == exitOK || !strings.Contains(errOut, "unknown") || !strings.Contains(errOut, "pg_terminate_backend") {
		t.Errorf("machines of an unknown process: exit %d, stdout %s, stderr:\n%s", code, out, errOut)
	}
	if err := victim.Ping(ctx); err != nil {
		t.Fatalf("an unknown process's recorded condition ended another backend: %v", err)
	}

	// Restored, the registry's condition is the binary's again.
	setCondition(recovery.Process.Name, recovery.Candidates(time.Minute, time.Minute).SQL())
	if code, out, errOut := eligible(); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Errorf("restored registry: exit %d, stdout %s, stderr:\n%s", code, out, errOut)
	}
}
