// Package bmdbtest gives Shepherd's own tests a real, migrated PostgreSQL
// database of their own, and the machinery's DB on it (sessions, claims,
// leases): what a test of the runner, the daemon or the data layer needs.
// A user's module uses the public kit, package bmdb/bmdbtest, which runs
// on this one and shows only the public bmdb.
//
// The BMDB's guarantees (exclusive leases under READ COMMITTED, session
// fencing, causal history) live in constraints and locking that only a real
// server exercises, so tests run against PostgreSQL, never a mock. To keep
// that fast and parallel, a test binary uses one server and one migrated
// template database, and every test gets a fresh copy of the template
// (CREATE DATABASE ... TEMPLATE, a file copy, far cheaper than migrating).
//
// A package using it calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { bmdbtest.Main(m) }
//
// and each test calls NewDatabase (or NewEmptyDatabase) for its DSN.
//
// The server is the one named by SHEPHERD_TEST_DSN when that is set (a DSN
// of a database on a server where its role may CREATE DATABASE), else a
// private cluster started from the machine's PostgreSQL binaries for the
// duration of the test binary. Tests never skip for lack of a database: a
// skipped database test protects nothing, so a missing server fails the
// whole binary with an error that says what to install.
package bmdbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"go.uber.org/goleak"

	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
)

// EnvDSN names the environment variable that points the tests at an existing
// server instead of a private cluster: a DSN (URL or key=value) of a database
// there, whose role may CREATE DATABASE. Every test database is created on
// that server and named after it.
const EnvDSN = "SHEPHERD_TEST_DSN"

// tempPrefix names the private clusters' directories in os.TempDir, so that
// a later test binary can find and remove those a killed one left behind.
const tempPrefix = "shepherd-bmdbtest-"

// ownerFile, in a private cluster's directory, holds the pid of the test
// binary that owns it.
const ownerFile = "owner.pid"

// setupTimeout bounds starting the server and building the template.
const setupTimeout = 3 * time.Minute

// opTimeout bounds creating or dropping one test database.
const opTimeout = time.Minute

var (
	// Set by Main before any test runs, read-only afterwards.
	ready    bool
	cluster  *pgcluster.Cluster
	adminDSN string // database from which CREATE/DROP DATABASE are issued
	dsnFor   func(dbname string) string
	template string // migrated template database
	// createSuffix ends every CREATE DATABASE: " STRATEGY FILE_COPY" on
	// PostgreSQL 15 and later, where copying the files of a small template
	// is about twice as fast as the default WAL_LOG strategy.
	createSuffix string
	runID        string // random, distinguishes this binary's databases

	// createMu serializes CREATE DATABASE: PostgreSQL refuses to copy a
	// template that another session is using, and a concurrent CREATE
	// DATABASE from the same template may count as one.
	createMu sync.Mutex
	seq      atomic.Uint64
)

// Main runs the tests of a package against PostgreSQL: it provides the
// server and the migrated template, runs m, tears everything down and exits
// with the tests' status. Call it from TestMain. If the server cannot be
// provided, it prints why to stderr and exits with status 1.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Parsing flags early lets setup honour -test.v; m.Run does not parse
	// them again.
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	teardown, err := setup(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bmdbtest: cannot provide a PostgreSQL server for the tests: %v\n", err)
		if terr := teardown(); terr != nil {
			fmt.Fprintf(os.Stderr, "bmdbtest: %v\n", terr)
		}
		return 1
	}
	ready = true
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "bmdbtest: tearing down: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	// Every goroutine a test started must be gone once the tests passed:
	// a pool, a session heartbeat or a runner left running is a leak a
	// daemon would have too.
	if code == 0 {
		if err := goleak.Find(goleakOptions...); err != nil {
			fmt.Fprintf(os.Stderr, "bmdbtest: goroutines left running after the tests: %v\n", err)
			code = 1
		}
	}
	return code
}

// goleakOptions are the goroutines that may outlive a package's tests:
// those of the standard library and libraries that are process-wide by
// design, never ours.
var goleakOptions = []goleak.Option{
	// klog's flush daemon runs for the process's lifetime.
	goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	// golang-migrate reads a migration's file ahead into a pipe; when the
	// migration fails (the tests of a half-applied migration do that on
	// purpose), nothing drains the pipe and its reader is left blocked.
	// golang-migrate's, bounded by one file per failed migration.
	goleak.IgnoreAnyFunction("github.com/golang-migrate/migrate/v4.(*Migration).Buffer"),
	// fasthttp keeps the Date header's value up to date, once a second,
	// for the process's lifetime, from the first answer of any of its
	// servers (heartbeat.Server.Serve).
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	// fasthttp's worker pool (heartbeat.Server.Serve) cleans its idle
	// workers every MaxIdleWorkerDuration, sleeping in between: stopped,
	// its cleaner ends when it next wakes. fasthttp's, bounded by one per
	// Serve stopped in the last seconds.
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
}

// setup provides the server and the template. The returned teardown undoes
// whatever part of it succeeded, and is never nil.
func setup(ctx context.Context) (teardown func() error, err error) {
	var undo []func() error
	teardown = func() error {
		var errs []error
		for i := len(undo) - 1; i >= 0; i-- {
			errs = append(errs, undo[i]())
		}
		return errors.Join(errs...)
	}

	logf := func(string, ...any) {}
	if testing.Verbose() {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}

	var server string // for errors
	id := make([]byte, 4)
	if _, err := rand.Read(id); err != nil {
		return teardown, fmt.Errorf("generating a run id: %w", err)
	}
	runID = hex.EncodeToString(id)

	if dsn := os.Getenv(EnvDSN); dsn != "" {
		adminDSN = dsn
		if dsnFor, err = dsnDeriver(dsn); err != nil {
			return teardown, fmt.Errorf("%s: %w", EnvDSN, err)
		}
		server = "the server of " + EnvDSN
		logf("bmdbtest: using %s", server)
	} else {
		removeLeftovers(logf)
		dir, err := os.MkdirTemp("", tempPrefix)
		if err != nil {
			return teardown, fmt.Errorf("creating the cluster directory: %w", err)
		}
		undo = append(undo, func() error {
			if err := os.RemoveAll(dir); err != nil {
				return fmt.Errorf("removing %s: %w", dir, err)
			}
			return nil
		})
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return teardown, fmt.Errorf("writing %s: %w", ownerFile, err)
		}
		c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: dir, Fast: true, Logf: logf})
		if err != nil {
			return teardown, err
		}
		undo = append(undo, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			return c.Stop(ctx)
		})
		cluster = c
		server = fmt.Sprintf("the private cluster at 127.0.0.1:%d", c.Port)
		adminDSN = c.DSN("postgres")
		dsnFor = c.DSN
	}

	var version int
	if err := adminQueryRow(ctx, "SELECT current_setting('server_version_num')::int", &version); err != nil {
		return teardown, fmt.Errorf("reading the server version from %s: %w", server, err)
	}
	if version >= 150000 {
		createSuffix = " STRATEGY FILE_COPY"
	}

	// The template: migrated once, copied for every test. It refuses
	// connections once built, so that nothing (autovacuum included) can be
	// connected to it when a test copies it.
	template = "shepherd_template_" + runID
	if err := createDatabase(ctx, template, "template0"); err != nil {
		return teardown, err
	}
	if cluster == nil {
		// A private cluster goes away whole; an external server keeps only
		// what we do not drop.
		undo = append(undo, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			return dropDatabase(ctx, template)
		})
	}
	if err := migrate.MigrateUp(ctx, dsnFor(template)); err != nil {
		return teardown, fmt.Errorf("migrating the template database: %w", err)
	}
	if err := adminExec(ctx, "ALTER DATABASE "+pgx.Identifier{template}.Sanitize()+" ALLOW_CONNECTIONS false"); err != nil {
		return teardown, fmt.Errorf("closing the template database to connections: %w", err)
	}
	logf("bmdbtest: template database %s ready", template)
	return teardown, nil
}

// NewDatabase returns the DSN of a new database holding the migrated BMDB
// schema and no data, for t alone; it is dropped when t ends. Safe to call
// from parallel tests.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabase(t, template)
}

// NewEmptyDatabase returns the DSN of a new database without the BMDB schema
// (not migrated at all), for tests of the migrations themselves. It is
// dropped when t ends.
func NewEmptyDatabase(t testing.TB) string {
	t.Helper()
	// template0 is pristine on every server, whatever was added to template1.
	return newDatabase(t, "template0")
}

// Cluster returns the private cluster the tests run against, for fault tests
// that restart or stop the server. It is nil when SHEPHERD_TEST_DSN names an
// external server: such tests should skip then, since they cannot control it.
func Cluster() *pgcluster.Cluster {
	return cluster
}

func newDatabase(t testing.TB, from string) string {
	t.Helper()
	if !ready {
		t.Fatal("bmdbtest: no database server: call bmdbtest.Main(m) from the package's TestMain")
	}
	name := databaseName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := createDatabase(ctx, name, from); err != nil {
		t.Fatalf("bmdbtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := dropDatabase(ctx, name); err != nil {
			t.Errorf("bmdbtest: %v", err)
		}
	})
	return dsnFor(name)
}

// databaseName returns a name unique to this binary run and call, carrying
// as much of the test's name as fits, so that a database seen in
// pg_stat_activity or left behind says which test made it.
func databaseName(testName string) string {
	const maxIdentifier = 63 // PostgreSQL's NAMEDATALEN - 1
	name := fmt.Sprintf("shepherd_test_%s_%d_", runID, seq.Add(1))
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		if b.Len()+len(name) >= maxIdentifier {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return strings.TrimRight(name+b.String(), "_")
}

// createDatabase creates name as a copy of from. It retries while the
// source is in use (SQLSTATE 55006): a session that just disconnected from
// it may not have exited yet.
func createDatabase(ctx context.Context, name, from string) error {
	createMu.Lock()
	defer createMu.Unlock()
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{from}.Sanitize() + createSuffix
	for delay := 100 * time.Millisecond; ; delay *= 2 {
		err := adminExec(ctx, sql)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" || delay > 3*time.Second {
			if err != nil {
				return fmt.Errorf("creating database %s from %s: %w", name, from, err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("creating database %s from %s: %w (%w)", name, from, ctx.Err(), err)
		case <-time.After(delay):
		}
	}
}

// dropDatabase drops name, disconnecting whatever the test left connected.
func dropDatabase(ctx context.Context, name string) error {
	if err := adminExec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping database %s: %w", name, err)
	}
	return nil
}

// adminExec runs one statement on the admin database, on a connection of its
// own: a shared connection would not survive a fault test restarting the
// server.
func adminExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("connecting to the test server: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// adminQueryRow runs a one-row query on the admin database and scans it.
func adminQueryRow(ctx context.Context, sql string, dest ...any) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("connecting to the test server: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// dsnDeriver returns a function giving dsn with its database replaced, for
// both URL and key=value DSNs.
func dsnDeriver(dsn string) (func(string) string, error) {
	if _, err := pgx.ParseConfig(dsn); err != nil {
		// pgx's parse errors may quote the DSN, password included.
		return nil, errors.New("cannot parse it as a PostgreSQL URL or key=value DSN")
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, errors.New("cannot parse it as a URL")
		}
		return func(dbname string) string {
			v := *u
			v.Path = "/" + dbname
			v.RawPath = ""
			return v.String()
		}, nil
	}
	// key=value: a later dbname overrides an earlier one.
	return func(dbname string) string {
		quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(dbname)
		return dsn + " dbname='" + quoted + "'"
	}, nil
}

// removeLeftovers stops and removes the private clusters of test binaries
// that died without tearing down (a panic, a -timeout, a kill): their
// servers would otherwise run forever. A cluster whose owner still runs is
// left alone.
func removeLeftovers(logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being set up, or not ours
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || owner <= 0 || !errors.Is(syscall.Kill(owner, 0), syscall.ESRCH) {
			continue
		}
		if pid, ok := pgcluster.ServerPID(filepath.Join(dir, "data")); ok {
			// SIGQUIT: immediate shutdown; the data is thrown away anyway.
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(100 * time.Millisecond)
			}
		}
		logf("bmdbtest: removing %s, left behind by test process %d", dir, owner)
		_ = os.RemoveAll(dir)
	}
}
