package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
)

// demoDatabase names the database demo mode creates in its cluster.
const demoDatabase = "shepherd"

// demoGroups are the flag defaults demo mode changes, so that a visitor
// sees Recovery reboot machines and failed machines retried within a minute
// or two, not after the production timeouts (10 min, 30 min, 5 min
// backoffs): each process's DemoFlags, the simulated fleet's heartbeat
// loss, and every process's backoff shortened to 10s..2m. Flags are
// grouped: a group is changed only if the operator set none of its flags,
// so that an explicit -agentstart_backoff_initial 10m is not met by a demo
// maximum below it.
func demoGroups(processes []Process) [][][2]string {
	var groups [][][2]string
	for _, p := range processes {
		names := make([]string, 0, len(p.DemoFlags))
		for name := range p.DemoFlags {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			groups = append(groups, [][2]string{{name, p.DemoFlags[name]}})
		}
	}
	groups = append(groups, [][2]string{{"sim_heartbeat_loss_rate", "0.5"}})
	for _, p := range processes {
		l := p.Info.Label
		groups = append(groups, [][2]string{{l + "_backoff_initial", "10s"}, {l + "_backoff_maximum", "2m"}})
	}
	return groups
}

// applyDemoDefaults sets the demo defaults of the flags the command line did
// not set, and returns them as -name=value for the log.
func applyDemoDefaults(fs *flag.FlagSet, processes []Process) ([]string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var applied []string
group:
	for _, g := range demoGroups(processes) {
		for _, kv := range g {
			if set[kv[0]] {
				continue group
			}
		}
		for _, kv := range g {
			if err := fs.Set(kv[0], kv[1]); err != nil {
				// A mistake of a process's DemoFlags.
				return nil, fmt.Errorf("demo default -%s=%s: %w", kv[0], kv[1], err)
			}
			applied = append(applied, "-"+kv[0]+"="+kv[1])
		}
	}
	return applied, nil
}

// startDemo provides the database of demo mode: a private PostgreSQL
// cluster in stateDir (created on first use, reused afterwards, so that the
// simulated fleet and its history survive restarts), with a migrated
// database. The caller stops the cluster after the loops have stopped.
//
// Demo mode exists so that one command, with nothing provisioned, shows the
// whole system working; it is never how a fleet is run.
func startDemo(ctx context.Context, stateDir string, changedDefaults []string, statusURL string, exts []*bmdb.Extension) (*pgcluster.Cluster, string, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, "", fmt.Errorf("-state_dir %s: %w", stateDir, err)
	}
	klog.InfoS("DEMO MODE: no database given (-bmdb_dsn, -bmdb_dsn_file or $"+envDSN+"), so shepherd runs a private PostgreSQL and a simulated fleet (-provider sim)", "dir", abs)
	klog.InfoS("DEMO MODE: to run against a real database instead: create it, run 'shepherd migrate up -bmdb_dsn <dsn>', then 'shepherd -bmdb_dsn <dsn>' (or set $" + envDSN + ")")

	if len(changedDefaults) > 0 {
		klog.InfoS("DEMO MODE: flag defaults changed so that the loops show work within a minute or two (give a flag to override)", "flags", strings.Join(changedDefaults, " "))
	}

	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: abs, Logf: func(format string, args ...any) {
		klog.InfoS("DEMO MODE: PostgreSQL", "msg", fmt.Sprintf(format, args...))
	}})
	if err != nil {
		return nil, "", fmt.Errorf("demo mode: starting PostgreSQL: %w", err)
	}
	fail := func(err error) (*pgcluster.Cluster, string, error) {
		stopDemo(c)
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
	if err := bmdb.MigrateUp(ctx, dsn, exts...); err != nil {
		return fail(fmt.Errorf("demo mode: %w", err))
	}
	klog.InfoS("DEMO MODE: BMDB ready; its data stays in dir between runs (delete the directory to start afresh)", "addr", fmt.Sprintf("127.0.0.1:%d/%s", c.Port, demoDatabase), "dir", abs)
	if err := writeDemoDSN(abs, dsn); err != nil {
		return fail(fmt.Errorf("demo mode: %w", err))
	}
	cliHint := "shepherd machines"
	if cwd, err := os.Getwd(); err != nil || filepath.Join(cwd, defaultStateDir) != abs {
		cliHint += " -state_dir " + abs
	}
	klog.InfoS("DEMO MODE: status page at url; operator commands find this demo by themselves, e.g. try", "url", statusURL, "try", cliHint)
	return c, dsn, nil
}

// defaultStateDir is -state_dir's default, shared by the daemon and the
// operator commands, so that both find the same demo.
const defaultStateDir = ".shepherd"

// demoDSNFile is the file in -state_dir through which a running demo tells
// the operator commands how to reach its database: the port changes every
// run and the DSN (no TLS, user postgres) is not one an operator guesses.
const demoDSNFile = "demo.dsn"

// writeDemoDSN publishes a running demo's DSN in its state directory; only
// the owner may read it, like the cluster's data beside it.
func writeDemoDSN(stateDir, dsn string) error {
	path := filepath.Join(stateDir, demoDSNFile)
	if err := os.WriteFile(path, []byte(dsn+"\n"), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// runningDemoDSN returns the DSN of the demo running in stateDir, or "" when
// none is: the file is written once the demo's database is ready and
// removed when the demo stops (a demo killed with SIGKILL leaves it, and
// connecting then fails with a message that says so).
func runningDemoDSN(stateDir string) (dsn, abs string, err error) {
	abs, err = filepath.Abs(stateDir)
	if err != nil {
		return "", "", fmt.Errorf("-state_dir %s: %w", stateDir, err)
	}
	raw, err := os.ReadFile(filepath.Join(abs, demoDSNFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", abs, nil
	}
	if err != nil {
		return "", abs, fmt.Errorf("reading the demo's DSN: %w", err)
	}
	return strings.TrimSpace(string(raw)), abs, nil
}

// stopDemo stops demo mode's PostgreSQL, first withdrawing its DSN from the
// operator commands.
func stopDemo(c *pgcluster.Cluster) {
	if err := os.Remove(filepath.Join(c.Dir, demoDSNFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		klog.ErrorS(err, "DEMO MODE: withdrawing the demo's DSN failed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		klog.ErrorS(err, "DEMO MODE: stopping PostgreSQL failed")
		return
	}
	klog.InfoS("DEMO MODE: PostgreSQL stopped", "dir", c.DataDir)
}
