package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
	"github.com/shepherd-fleet/shepherd/internal/secretfile"
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

// demoProvider reports whether demo mode may run with the provider named
// name: the simulator, or a registered provider that declares itself a
// simulation (Provider.Demo). Never the static inventory, whose machines
// are real.
func (d *Daemon) demoProvider(name string) bool {
	if name == providerSim {
		return true
	}
	for _, p := range d.providers {
		if p.Name == name {
			return p.Demo
		}
	}
	return false
}

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
func startDemo(ctx context.Context, prog, stateDir, provider string, changedDefaults []string, statusURL string, exts []*bmdb.Extension) (*pgcluster.Cluster, string, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, "", fmt.Errorf("-state_dir %s: %w", stateDir, err)
	}
	klog.InfoS("DEMO MODE: no database given (-bmdb_dsn, -bmdb_dsn_file or $"+envDSN+"), so "+prog+" runs a private PostgreSQL and a simulated fleet", "provider", provider, "dir", abs)
	klog.InfoS("DEMO MODE: to run against a real database instead: create it, run '" + prog + " migrate up -bmdb_dsn <dsn>', then '" + prog + " -bmdb_dsn <dsn>' (or set $" + envDSN + ")")

	if len(changedDefaults) > 0 {
		klog.InfoS("DEMO MODE: flag defaults changed so that the loops show work within a minute or two (give a flag to override)", "flags", strings.Join(changedDefaults, " "))
	}

	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: abs, Password: true, TemporarySearch: true, Logf: func(format string, args ...any) {
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
	cliHint := prog + " machines"
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
// the operator commands how to reach its database: the port and the
// superuser's password change every run, and the DSN (no TLS, user
// postgres) is not one an operator guesses.
const demoDSNFile = "demo.dsn"

// maxDemoDSN bounds demo.dsn: a DSN is a line.
const maxDemoDSN = 4 << 10

// writeDemoDSN publishes a running demo's DSN, password included, in its
// state directory; only the owner may read it. A file already there (a
// killed demo's) is replaced, not written through: it could be a link.
func writeDemoDSN(stateDir, dsn string) error {
	path := filepath.Join(stateDir, demoDSNFile)
	tmp, err := os.CreateTemp(stateDir, demoDSNFile+".*")
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

// runningDemoDSN returns the DSN of the demo running in stateDir, or "" when
// none is: the file is written once the demo's database is ready and
// removed when the demo stops (a demo killed with SIGKILL leaves it, and
// connecting then fails with a message that says so).
//
// The file must be one the demo wrote for us: a regular file (not a link),
// owner-only, owned by us or root (see secretfile.CheckInfo). Anyone else's
// demo.dsn, say in a shared directory the command runs in, would point our
// commands (and the pause reasons or operator names they write) at a
// database of that user's choosing.
func runningDemoDSN(stateDir string) (dsn, abs string, err error) {
	abs, err = filepath.Abs(stateDir)
	if err != nil {
		return "", "", fmt.Errorf("-state_dir %s: %w", stateDir, err)
	}
	path := filepath.Join(abs, demoDSNFile)
	// O_NONBLOCK: a FIFO planted there must not hang the command.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return "", abs, nil
	}
	if errors.Is(err, syscall.ELOOP) {
		return "", abs, fmt.Errorf("the demo's DSN: %s is a symbolic link, which no demo writes: not used", path)
	}
	if err != nil {
		return "", abs, fmt.Errorf("reading the demo's DSN: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", abs, fmt.Errorf("reading the demo's DSN: %w", err)
	}
	if err := secretfile.CheckInfo(path, info); err != nil {
		return "", abs, fmt.Errorf("the demo's DSN: %w; not used", err)
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxDemoDSN+1))
	if err != nil {
		return "", abs, fmt.Errorf("reading the demo's DSN: %w", err)
	}
	if len(raw) > maxDemoDSN {
		return "", abs, fmt.Errorf("the demo's DSN: %s is larger than %d bytes, which no demo writes: not used", path, maxDemoDSN)
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
