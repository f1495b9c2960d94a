package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/sqlconst"
)

// Every statement of queries.go, read from the source, prepares against a
// database migrated as the benchmark migrates its own: a renamed column
// fails here, in seconds, not in the middle of a benchmark run.
func TestEveryStatementPrepares(t *testing.T) {
	stmts, _, err := sqlconst.Read(".", regexp.MustCompile(`^q[A-Z]`))
	if err != nil {
		t.Fatalf("reading the statements from the source: %v", err)
	}
	// A floor, so that a broken derivation cannot pass by finding none.
	if len(stmts) < 9 {
		t.Fatalf("found %d statements in the source, want the command's 9 or more", len(stmts))
	}
	args := []string{"-fast", "-dir", filepath.Join(t.TempDir(), "pg")}
	if dsn := os.Getenv("SHEPHERD_TEST_DSN"); dsn != "" {
		args = []string{"-dsn", dsn}
	}
	o, err := parseFlags(args, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := startServer(ctx, o, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close(context.Background())
	_, dsn, err := srv.newDatabase(ctx, "queries", true)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range stmts {
			if !yield(n) {
				return
			}
		}
	})
	// pg_stat_statements is a view of the admin database, where the
	// benchmark creates the extension.
	admin, err := pgx.Connect(ctx, srv.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	for _, name := range names {
		conn := conn
		if strings.Contains(stmts[name], "FROM pg_stat_statements") {
			if !srv.statements {
				t.Logf("%s: pg_stat_statements not loaded, not prepared", name)
				continue
			}
			conn = admin
		}
		if _, err := conn.Prepare(ctx, name, stmts[name]); err != nil {
			t.Errorf("%s does not prepare: %v\n%s", name, err, stmts[name])
		}
	}
	t.Logf("%d statements prepared", len(names))
}
