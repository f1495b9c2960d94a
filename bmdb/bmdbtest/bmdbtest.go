// Package bmdbtest gives the tests of a process or a provider a real,
// migrated PostgreSQL database of their own, and the BMDB on it as the
// process is given it (bmdb.DB).
//
// The BMDB's guarantees (exclusive leases under READ COMMITTED, session
// fencing, causal history) live in constraints and locking that only a
// real server exercises, so tests run against PostgreSQL, never a mock. A
// test binary uses one server and one migrated template database, and
// every test gets a fresh copy of the template, far cheaper than
// migrating.
//
// A package using it calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { bmdbtest.Main(m) }
//
// and each test calls NewDatabase for its DSN (with the process's own
// migrations) and Open for the BMDB on it. To run a process's handler on a
// machine, see package controlloop/controlloopt; to build and run a
// binary, package shepherdcli/shepherdclitest.
//
// The server is the one named by SHEPHERD_TEST_DSN when that is set (a DSN
// of a database on a server where its role may CREATE DATABASE), else a
// private cluster started from the machine's PostgreSQL server binaries
// (initdb and pg_ctl, on PATH or under /usr/lib/postgresql/*/bin) for the
// duration of the test binary. Tests never skip for lack of a
// database: a missing server fails the whole binary with an error that
// says what to install.
package bmdbtest

import (
	"context"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// EnvDSN names the environment variable that points the tests at an
// existing server instead of a private cluster.
const EnvDSN = "SHEPHERD_TEST_DSN"

// Main runs the tests of a package against PostgreSQL: it provides the
// server and the migrated template, runs m, tears everything down and
// exits with the tests' status. Call it from TestMain. If the server
// cannot be provided, it prints why to stderr and exits with status 1.
// Once the tests passed, it fails the binary if a goroutine they started
// (a pool, a runner) is still running.
func Main(m *testing.M) { bmdbtest.Main(m) }

// NewDatabase returns the DSN of a new database for t alone, dropped when
// t ends: Shepherd's schema, then the migrations of exts (a process's own
// tables), and no data. Safe to call from parallel tests.
func NewDatabase(t testing.TB, exts ...*bmdb.Extension) string {
	t.Helper()
	dsn := bmdbtest.NewDatabase(t)
	if len(exts) == 0 {
		return dsn
	}
	machinery := make([]*migrate.Extension, len(exts))
	for i, e := range exts {
		machinery[i] = migrate.ExtensionOf(e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrate.MigrateUp(ctx, dsn, machinery...); err != nil {
		t.Fatalf("bmdbtest: migrating the extensions: %v", err)
	}
	return dsn
}

// Open opens the BMDB at dsn as a process or provider is given it,
// closed when t ends.
func Open(t testing.TB, dsn string) bmdb.DB {
	t.Helper()
	return bmdbtest.Open(t, dsn).Public()
}

// AddMachines adds n machines of provider "test" to db in one
// transaction, each with a provider id of its own and a documentation
// address (192.0.2.0/24), and returns their ids in the order added.
func AddMachines(t testing.TB, db bmdb.DB, n int) []uuid.UUID {
	t.Helper()
	return bmdbtest.AddMachinesIn(t, db, n)
}

// Events lists the event names of h, in its order (Started, Finished,
// ...), for comparing a history with the one a test expects.
func Events(h []bmdb.HistoryEntry) []bmdb.Event { return bmdbtest.Events(h) }

// WaitFor polls cond until it reports done, and fails t if timeout passes
// first, saying what it waited for and the state cond last described. It
// returns how long it waited. Tests wait on a condition with it instead
// of sleeping.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (done bool, state string)) time.Duration {
	t.Helper()
	return bmdbtest.WaitFor(t, timeout, what, cond)
}

// WaitUntil is WaitFor for a condition that says only whether it holds.
func WaitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return bmdbtest.WaitUntil(t, timeout, what, cond)
}

// ProvidedBy returns the machines that provider lists in db, by provider
// id.
func ProvidedBy(t testing.TB, db bmdb.DB, provider string) map[string]bmdb.Provided {
	t.Helper()
	return bmdbtest.ProvidedByIn(t, db, provider)
}

// LastHeartbeat is the machine's last recorded agent heartbeat, zero if it
// has none.
func LastHeartbeat(t testing.TB, db bmdb.DB, machine uuid.UUID) time.Time {
	t.Helper()
	return bmdbtest.LastHeartbeatIn(t, db, machine)
}
