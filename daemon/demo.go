package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
)

// envDSN names the environment variable of the BMDB DSN, which demo
// mode's messages name (the command line reads it).
const envDSN = "SHEPHERD_BMDB_DSN"

// demoDatabase names the database demo mode creates in its cluster.
const demoDatabase = "shepherd"

// startDemo provides the database of demo mode: a private PostgreSQL
// cluster in stateDir (created on first use, reused afterwards, so that the
// simulated fleet and its history survive restarts), with a migrated
// database. The caller stops the cluster after the loops have stopped.
//
// Demo mode exists so that one command, with nothing provisioned, shows the
// whole system working; it is never how a fleet is run. Its server runs for
// as long as the visitor likes on a host others may use, so it requires a
// password (new at every start, known only through the owner-only
// demo.dsn): without one, any local user would connect as superuser and
// run commands as the server's OS user. As root, the operator's directories
// above -state_dir are opened to the postgres user only while a PostgreSQL
// command runs, never for good.
func startDemo(ctx context.Context, prog, stateDir, provider string, changedDefaults []string, statusURL string, exts []*migrate.Extension) (*pgcluster.Cluster, string, error) {
	log := klog.FromContext(ctx)
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, "", fmt.Errorf("-state_dir %s: %w", stateDir, err)
	}
	log.Info("DEMO MODE: no database given (-bmdb_dsn, -bmdb_dsn_file or $"+envDSN+"), so "+prog+" runs a private PostgreSQL and a simulated fleet", "provider", provider, "dir", abs)
	log.Info("DEMO MODE: to run against a real database instead: create it, run '" + prog + " migrate up -bmdb_dsn <dsn>', then '" + prog + " -bmdb_dsn <dsn>' (or set $" + envDSN + ")")

	if len(changedDefaults) > 0 {
		log.Info("DEMO MODE: flag defaults changed so that the loops show work within a minute or two (give a flag to override)", "flags", strings.Join(changedDefaults, " "))
	}

	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: abs, Password: true, TemporarySearch: true, Logf: func(format string, args ...any) {
		log.Info("DEMO MODE: PostgreSQL", "msg", fmt.Sprintf(format, args...))
	}})
	if err != nil {
		return nil, "", fmt.Errorf("demo mode: starting PostgreSQL: %w", err)
	}
	fail := func(err error) (*pgcluster.Cluster, string, error) {
		stopDemo(ctx, c)
		return nil, "", err
	}
	err = c.CreateDatabase(ctx, demoDatabase, "")
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P04": // duplicate_database: kept from an earlier run
	case err != nil:
		return fail(fmt.Errorf("demo mode: %w", err))
	}
	dsn := c.DSN(demoDatabase)
	if err := migrate.MigrateUp(ctx, dsn, exts...); err != nil {
		return fail(fmt.Errorf("demo mode: %w", err))
	}
	log.Info("DEMO MODE: BMDB ready; its data stays in dir between runs (delete the directory to start afresh)", "addr", fmt.Sprintf("127.0.0.1:%d/%s", c.Port, demoDatabase), "dir", abs)
	if err := writeDemoDSN(abs, dsn); err != nil {
		return fail(fmt.Errorf("demo mode: %w", err))
	}
	cliHint := prog + " machines"
	if cwd, err := os.Getwd(); err != nil || filepath.Join(cwd, DefaultStateDir) != abs {
		cliHint += " -state_dir " + abs
	}
	log.Info("DEMO MODE: status page at url; operator commands find this demo by themselves, e.g. try", "url", statusURL, "try", cliHint)
	return c, dsn, nil
}

// DemoDSNFile is the file in -state_dir through which a running demo tells
// the operator commands how to reach its database: the port and the
// superuser's password change every run, and the DSN (no TLS, user
// postgres) is not one an operator guesses.
const DemoDSNFile = "demo.dsn"

// writeDemoDSN publishes a running demo's DSN, password included, in its
// state directory; only the owner may read it. A file already there (a
// killed demo's) is replaced, not written through: it could be a link.
func writeDemoDSN(stateDir, dsn string) error {
	path := filepath.Join(stateDir, DemoDSNFile)
	tmp, err := os.CreateTemp(stateDir, DemoDSNFile+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // fails once renamed
	_, err = tmp.WriteString(dsn + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// stopDemo stops demo mode's PostgreSQL, first withdrawing its DSN from the
// operator commands.
func stopDemo(ctx context.Context, c *pgcluster.Cluster) {
	log := klog.FromContext(ctx)
	if err := os.Remove(filepath.Join(c.Dir, DemoDSNFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Error(err, "DEMO MODE: withdrawing the demo's DSN failed")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		log.Error(err, "DEMO MODE: stopping PostgreSQL failed")
		return
	}
	log.Info("DEMO MODE: PostgreSQL stopped", "dir", c.DataDir)
}

// demoCluster is demo mode's PostgreSQL as a Runnable: Start starts it
// (abandoned if the daemon stops meanwhile), hands its DSN to ready, and
// stops it when ctx is done, which is after the database's connections
// have closed.
type demoCluster struct {
	opts      *Options
	statusURL string
	// stop ends the start early: the daemon stops before the cluster's
	// own stage does.
	stop  context.Context
	ready chan string
}

func (c *demoCluster) Start(ctx context.Context) error {
	startCtx, cancel := context.WithCancel(ctx)
	defer context.AfterFunc(c.stop, cancel)()
	o := c.opts
	cluster, dsn, err := startDemo(startCtx, o.Name, o.StateDir, o.Provider.Name, o.DemoDefaults, c.statusURL, migrate.ExtensionsOf(o.Extensions))
	cancel()
	if err != nil {
		if c.stop.Err() != nil {
			return nil
		}
		return err
	}
	c.ready <- dsn
	<-ctx.Done()
	stopDemo(ctx, cluster)
	return nil
}
