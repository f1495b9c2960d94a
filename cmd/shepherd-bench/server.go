package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	bmdbmigrate "github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
)

// server is the PostgreSQL server under test: a private cluster, or the one
// of -dsn. Every scenario gets databases of its own on it, so that one
// scenario's dead tuples and history do not weigh on the next.
type server struct {
	cluster  *pgcluster.Cluster // nil with -dsn
	dir      string             // the private cluster's directory, removed at the end
	adminDSN string             // where CREATE DATABASE and statistics queries run
	dsnFor   func(db string) (string, error)
	runID    string
	template string // migrated database the BMDB databases are copied from
	created  []string
	keep     bool
	logf     func(format string, args ...any)
	// statements: pg_stat_statements is loaded and readable from the
	// admin database (enableStatements).
	statements bool
}

// startServer starts a private cluster, or connects to o.dsn.
func startServer(ctx context.Context, o *options, logf func(string, ...any)) (*server, error) {
	id := make([]byte, 3)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	s := &server{runID: hex.EncodeToString(id), keep: o.keep, logf: logf}
	if o.dsn != "" {
		s.adminDSN = o.dsn
		s.dsnFor = func(db string) (string, error) { return withDatabase(o.dsn, db) }
		if o.costs {
			if err := s.enableStatements(ctx); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "shepherd-bench-")
		if err != nil {
			return nil, err
		}
		dir, s.dir = d, d
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: dir, Fast: o.fast, Settings: o.pgSettings, Logf: logf})
	if err != nil {
		if s.dir != "" {
			os.RemoveAll(s.dir)
		}
		return nil, err
	}
	s.cluster = c
	s.adminDSN = c.DSN("postgres")
	s.dsnFor = func(db string) (string, error) { return c.DSN(db), nil }
	if o.costs {
		if err := s.preloadStatements(ctx, o); err != nil {
			s.close(ctx)
			return nil, err
		}
		if err := s.enableStatements(ctx); err != nil {
			s.close(ctx)
			return nil, err
		}
	}
	return s, nil
}

// preloadStatements starts the private cluster again with pg_stat_statements
// loaded, when the server has it and -pg_setting did not choose the
// preloaded libraries: a library is loaded only at start, and whether it is
// installed is known only once a server runs.
func (s *server) preloadStatements(ctx context.Context, o *options) error {
	for _, setting := range o.pgSettings {
		if name, _, _ := strings.Cut(setting, "="); strings.TrimSpace(name) == "shared_preload_libraries" {
			return nil
		}
	}
	available, loaded, err := s.statementsAvailable(ctx)
	if err != nil || !available || loaded {
		return err
	}
	if err := s.cluster.Stop(ctx); err != nil {
		return err
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: s.cluster.Dir, Fast: o.fast,
		Settings: append(slices.Clone(o.pgSettings), preloadStatements), Logf: s.logf})
	if err != nil {
		return err
	}
	s.cluster = c
	s.adminDSN = c.DSN("postgres")
	s.dsnFor = func(db string) (string, error) { return c.DSN(db), nil }
	return nil
}

// withDatabase returns dsn (a URL or key=value string) naming database db.
func withDatabase(dsn, db string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("-dsn: cannot parse it as a URL")
		}
		u.Path = "/" + db
		u.RawPath = ""
		return u.String(), nil
	}
	// Later keywords win in libpq and pgx alike.
	return dsn + " dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db) + "'", nil
}

// newDatabase creates an empty database for purpose (a short word) and
// returns its name and DSN. With migrate, it has the BMDB schema: it is a
// copy of a template migrated once per run, which is quicker than migrating
// every database.
func (s *server) newDatabase(ctx context.Context, purpose string, migrate bool) (name, dsn string, err error) {
	template := ""
	if migrate {
		if s.template == "" {
			t := "shepherd_bench_template_" + s.runID
			if err := s.createDatabase(ctx, t, ""); err != nil {
				return "", "", err
			}
			tdsn, err := s.dsnFor(t)
			if err != nil {
				return "", "", err
			}
			if err := bmdbmigrate.MigrateUp(ctx, tdsn); err != nil {
				return "", "", err
			}
			s.template = t
		}
		template = s.template
	}
	name = "shepherd_bench_" + purpose + "_" + s.runID
	if err := s.createDatabase(ctx, name, template); err != nil {
		return "", "", err
	}
	if dsn, err = s.dsnFor(name); err != nil {
		return "", "", err
	}
	return name, dsn, nil
}

// seededDatabase creates a BMDB database for purpose and seeds n machines
// into it (started: each with an agent), returning its name, its DSN and
// how long seeding took. A database whose seeding failed is dropped.
func (b *bench) seededDatabase(ctx context.Context, purpose string, n int, started bool) (name, dsn string, seedTime time.Duration, err error) {
	name, dsn, err = b.srv.newDatabase(ctx, purpose, true)
	if err != nil {
		return "", "", 0, err
	}
	if seedTime, err = seed(ctx, dsn, n, started); err != nil {
		b.srv.dropDatabase(ctx, name)
		return "", "", 0, err
	}
	return name, dsn, seedTime, nil
}

// createDatabase creates database name, a copy of template unless that is
// empty.
func (s *server) createDatabase(ctx context.Context, name, template string) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return fmt.Errorf("connecting to create database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("dropping leftover database %s: %w", name, err)
	}
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	for attempt := 0; ; attempt++ {
		_, err = conn.Exec(ctx, sql)
		// The migration's connections to the template may take a moment
		// to go away (55006: object in use).
		var pgErr *pgconn.PgError
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "55006" && attempt < 50 {
			if sleep.For(ctx, 100*time.Millisecond) {
				continue
			}
		}
		break
	}
	if err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	s.created = append(s.created, name)
	return nil
}

// dropDatabase drops a database made by newDatabase, unless -keep.
func (s *server) dropDatabase(ctx context.Context, name string) {
	if s.keep {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		s.logf("dropping database %s: %v", name, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		s.logf("dropping database %s: %v", name, err)
		return
	}
	for i, n := range s.created {
		if n == name {
			s.created = append(s.created[:i], s.created[i+1:]...)
			break
		}
	}
}

// close drops what is left and stops the private cluster.
func (s *server) close(ctx context.Context) {
	for len(s.created) > 0 && !s.keep {
		s.dropDatabase(ctx, s.created[0])
	}
	if s.cluster == nil {
		return
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := s.cluster.Stop(stopCtx); err != nil {
		s.logf("%v", err)
	}
	if s.dir != "" && !s.keep {
		os.RemoveAll(s.dir)
	}
}

// xacts reads the transactions (committed + rolled back) that the server
// has counted for database db. It runs on the admin database, so that
// reading does not count.
func (s *server) xacts(ctx context.Context, conn *pgx.Conn, db string) (int64, error) {
	commit, rollback, err := s.xactCounts(ctx, conn, db)
	return commit + rollback, err
}

// xactCounts is xacts, committed and rolled back apart.
func (s *server) xactCounts(ctx context.Context, conn *pgx.Conn, db string) (commit, rollback int64, err error) {
	if err := conn.QueryRow(ctx, qXactCount, db).Scan(&commit, &rollback); err != nil {
		return 0, 0, fmt.Errorf("reading pg_stat_database: %w", err)
	}
	return commit, rollback, nil
}

// seed fills a migrated database with n provided machines (and, with
// started, an agent-started tag on each), then vacuums and analyzes it.
func seed(ctx context.Context, dsn string, n int, started bool) (time.Duration, error) {
	t0 := time.Now()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, qSeedMachines, n); err != nil {
		return 0, fmt.Errorf("seeding %d machines: %w", n, err)
	}
	if started {
		if _, err := conn.Exec(ctx, qSeedAgentStarted); err != nil {
			return 0, fmt.Errorf("seeding agent tags: %w", err)
		}
	}
	if err := vacuum(ctx, conn); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// vacuum vacuums and analyzes the database after a bulk load on conn, as
// autovacuum would, and checkpoints, so that neither autovacuum nor a
// checkpoint runs during the measurements that follow.
func vacuum(ctx context.Context, conn *pgx.Conn) error {
	// Best effort: servers before PostgreSQL 15 lack the function.
	if _, err := conn.Exec(ctx, qFlushStats); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42883" { // undefined_function
			return fmt.Errorf("flushing statistics: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, qVacuumAnalyze); err != nil {
		return fmt.Errorf("vacuuming: %w", err)
	}
	if _, err := conn.Exec(ctx, qCheckpoint); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	return nil
}

// cpuSeconds is the CPU time the private server has used so far: the
// postmaster's and its live children's user and system time, plus what
// its exited children used (cutime, cstime). Zero with -dsn (not ours to
// read).
func (s *server) cpuSeconds() (float64, error) {
	if s.cluster == nil {
		return 0, nil
	}
	pid, ok := pgcluster.ServerPID(s.cluster.DataDir)
	if !ok {
		return 0, errors.New("reading server CPU: no running server")
	}
	root, err := procStat(strconv.Itoa(pid))
	if err != nil {
		return 0, fmt.Errorf("reading server CPU: %w", err)
	}
	total := statNum(root, 11) + statNum(root, 12) + statNum(root, 13) + statNum(root, 14)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("reading server CPU: %w", err)
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		f, err := procStat(e.Name())
		if err != nil || len(f) < 15 || f[1] != strconv.Itoa(pid) {
			continue
		}
		total += statNum(f, 11) + statNum(f, 12)
	}
	return total / clockTicks, nil
}

// clockTicks is USER_HZ on Linux, the unit of /proc's CPU times.
const clockTicks = 100

// procStat reads /proc/<pid>/stat, returning its fields after the command
// name (which may hold spaces): state(0) ppid(1) ... utime(11) stime(12)
// cutime(13) cstime(14).
func procStat(pid string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return nil, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 15 {
		return nil, errors.New("unexpected /proc stat format")
	}
	return f, nil
}

func statNum(f []string, i int) float64 {
	v, _ := strconv.ParseFloat(f[i], 64)
	return v
}

// processCPUSeconds is the CPU time process pid has used (user and
// system, not its children's): the client's side of a unit of work.
func processCPUSeconds(pid int) (float64, error) {
	f, err := procStat(strconv.Itoa(pid))
	if err != nil {
		return 0, fmt.Errorf("reading the CPU time of process %d: %w", pid, err)
	}
	return (statNum(f, 11) + statNum(f, 12)) / clockTicks, nil
}
