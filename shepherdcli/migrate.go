package shepherdcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

const migrateUsage = `Usage: shepherd migrate [flags] up|down|version|force N

  up        apply every migration the database lacks (no-op when current):
            Shepherd's, then those of the binary's processes (extensions),
            and record what each declares about the binaries before it;
            on a newer schema, succeed doing nothing if this binary may run
            on it (docs/upgrading.md), fail naming the release to run if not
  down      revert every migration, the extensions' first: DROPS ALL
            SHEPHERD TABLES AND DATA; refuses to run without -yes
  version   print the schema versions, and whether they are dirty
  force N   record N as the clean version of Shepherd's schema without
            running anything, after repairing a dirty (half-applied)
            migration by hand

Flags may come before or after the action. SIGTERM or SIGINT ends a wait
for another migrate's lock at once, and otherwise stops after the migration
in progress. A migration waits at most 30s for a lock (set
lock_timeout in the DSN to change it); one that times out is rolled back but
recorded dirty: run 'migrate force N' with the version before it (and
-extension NAME for an extension's), then 'migrate up' again.
`

// runMigrate is the migrate subcommand.
func (d *CLI) runMigrate(args []string, stdout, stderr io.Writer) int {
	prog := d.prog()
	fs := flag.NewFlagSet(prog+" migrate", flag.ContinueOnError)
	var dsnf dsnFlags
	dsnf.register(fs)
	yes := fs.Bool("yes", false, "confirm 'migrate down', which drops every Shepherd table and all fleet data")
	extension := fs.String("extension", "", "with force: record the version of this extension (a process's own migrations) instead of Shepherd's")

	// Flags may follow the action ("migrate up -bmdb_dsn ..."): parse, take
	// the positional arguments, and parse what follows them again.
	var positional []string
	for {
		help, err := parseFlags(fs, args)
		if help {
			fmt.Fprint(stdout, renamed(prog, migrateUsage)+"\nFlags:\n")
			printDefaults(fs, prog, stdout)
			return exitOK
		}
		if err != nil {
			return reportUsage(stderr, d.prog(), err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}

	var ext *migrate.Extension
	if *extension != "" {
		i := slices.IndexFunc(d.extensions(), func(e *bmdbapi.Extension) bool { return e.Name == *extension })
		if i < 0 {
			var names []string
			for _, e := range d.extensions() {
				names = append(names, e.Name)
			}
			has := "none"
			if len(names) > 0 {
				has = strings.Join(names, ", ")
			}
			return reportUsage(stderr, d.prog(), usagef("-extension %q: this binary has no such extension (it has: %s)", *extension, has))
		}
		ext = migrate.ExtensionOf(d.extensions()[i])
	}
	action, err := migrateAction(positional, ext)
	if err != nil {
		return reportUsage(stderr, d.prog(), err)
	}
	dsn, err := dsnf.resolve()
	if err != nil {
		return reportUsage(stderr, d.prog(), err)
	}
	if dsn == "" {
		return reportUsage(stderr, d.prog(), usagef("migrate: no database: give -bmdb_dsn, -bmdb_dsn_file or $%s", envDSN))
	}
	if positional[0] == "down" && !*yes {
		return reportUsage(stderr, d.prog(), usagef("migrate down drops every Shepherd table and all fleet data (machines, leases, backoffs, history); add -yes to confirm"))
	}
	target, _ := describeDSN(dsn)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if positional[0] != "version" {
		if err := refuseTransactionPooler(ctx, dsn, target); err != nil {
			fmt.Fprintf(stderr, "%s: migrate: %v\n", prog, err)
			return exitFailure
		}
	}
	if err := action(ctx, dsn, target, migrate.ExtensionsOf(d.extensions()), stdout); err != nil {
		fmt.Fprintf(stderr, "%s: migrate: %v\n", prog, err)
		return exitFailure
	}
	return exitOK
}

// migrateFunc is a migrate action on the database at dsn (named target in
// messages), with the binary's extensions.
type migrateFunc func(ctx context.Context, dsn, target string, exts []*migrate.Extension, stdout io.Writer) error

// migrateAction checks the positional arguments and returns what to do.
// ext is the extension of -extension (nil: Shepherd's schema), which only
// force takes.
func migrateAction(pos []string, ext *migrate.Extension) (migrateFunc, error) {
	if len(pos) == 0 {
		return nil, usagef("migrate: want an action: up, down, version or force N")
	}
	want := 1
	var fn migrateFunc
	switch pos[0] {
	case "up":
		fn = migrateUp
	case "down":
		fn = migrateDown
	case "version":
		fn = migrateVersion
	case "force":
		want = 2
		if len(pos) < 2 {
			return nil, usagef("migrate force: want the version to record, e.g. 'migrate force 1'")
		}
		v, err := strconv.ParseUint(pos[1], 10, 32)
		if err != nil {
			return nil, usagef("migrate force %q: want a schema version (a whole number)", pos[1])
		}
		if ext != nil {
			if uint(v) > ext.Latest() {
				return nil, usagef("migrate force %d: this binary knows versions of extension %s up to %d", v, ext.Name, ext.Latest())
			}
			fn = func(ctx context.Context, dsn, target string, _ []*migrate.Extension, stdout io.Writer) error {
				if err := migrate.ExtensionForce(ctx, dsn, ext, uint(v)); err != nil {
					return err
				}
				fmt.Fprintf(stdout, "%s: extension %s version recorded as %d (clean); no migration was run\n", target, ext.Name, v)
				return nil
			}
			break
		}
		if uint(v) > bmdb.LatestVersion() {
			return nil, usagef("migrate force %d: this binary knows schema versions up to %d", v, bmdb.LatestVersion())
		}
		fn = func(ctx context.Context, dsn, target string, _ []*migrate.Extension, stdout io.Writer) error {
			return migrateForce(ctx, dsn, target, uint(v), stdout)
		}
	default:
		return nil, usagef("migrate: unknown action %q: want up, down, version or force N", pos[0])
	}
	if ext != nil && pos[0] != "force" {
		return nil, usagef("migrate %s: -extension is for force only (%s applies to every extension)", pos[0], pos[0])
	}
	if len(pos) > want {
		return nil, usagef("migrate %s: unexpected argument %q", pos[0], pos[want])
	}
	return fn, nil
}

// versions reads the schema versions of Shepherd and of every extension.
func versions(ctx context.Context, dsn string, exts []*migrate.Extension) ([]uint, error) {
	v, _, err := migrate.SchemaVersion(ctx, dsn)
	if err != nil {
		return nil, err
	}
	out := []uint{v}
	for _, e := range exts {
		v, _, err := migrate.ExtensionVersion(ctx, dsn, e)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func migrateUp(ctx context.Context, dsn, target string, exts []*migrate.Extension, stdout io.Writer) error {
	from, err := versions(ctx, dsn, exts)
	if err != nil {
		return err
	}
	migrateErr := migrate.MigrateUp(ctx, dsn, exts...)
	// What was done is reported even when a later step failed.
	to, err := versions(context.WithoutCancel(ctx), dsn, exts)
	if err != nil {
		return errors.Join(migrateErr, err)
	}
	if from[0] == to[0] && to[0] > bmdb.LatestVersion() {
		fmt.Fprintf(stdout, "%s: schema at version %d, newer than this binary's %d, and every newer migration lets this binary run on it: nothing to do\n", target, to[0], bmdb.LatestVersion())
	} else if from[0] == to[0] {
		fmt.Fprintf(stdout, "%s: schema already at version %d, nothing to do\n", target, to[0])
	} else {
		fmt.Fprintf(stdout, "%s: migrated schema from version %d to %d\n", target, from[0], to[0])
	}
	warnOlderSessions(ctx, dsn, to[0], stdout)
	for i, e := range exts {
		if from[i+1] == to[i+1] && to[i+1] > e.Latest() {
			fmt.Fprintf(stdout, "%s: extension %s at version %d, newer than this binary's %d, and every newer migration lets this binary run on it: nothing to do\n", target, e.Name, to[i+1], e.Latest())
		} else if from[i+1] == to[i+1] {
			fmt.Fprintf(stdout, "%s: extension %s already at version %d, nothing to do\n", target, e.Name, to[i+1])
		} else {
			fmt.Fprintf(stdout, "%s: migrated extension %s from version %d to %d\n", target, e.Name, from[i+1], to[i+1])
		}
	}
	return migrateErr
}

func migrateDown(ctx context.Context, dsn, target string, exts []*migrate.Extension, stdout io.Writer) error {
	from, err := versions(ctx, dsn, exts)
	if err != nil {
		return err
	}
	if err := migrate.MigrateDown(ctx, dsn, exts...); err != nil {
		return err
	}
	for i := len(exts) - 1; i >= 0; i-- {
		if from[i+1] != 0 {
			fmt.Fprintf(stdout, "%s: migrated extension %s down from version %d to 0: its tables and their data are gone\n", target, exts[i].Name, from[i+1])
		}
	}
	if from[0] == 0 {
		fmt.Fprintf(stdout, "%s: schema was not migrated, nothing to do\n", target)
	} else {
		fmt.Fprintf(stdout, "%s: migrated schema down from version %d to 0: every Shepherd table and its data is gone\n", target, from[0])
	}
	return nil
}

func migrateVersion(ctx context.Context, dsn, target string, exts []*migrate.Extension, stdout io.Writer) error {
	v, dirty, err := migrate.SchemaVersion(ctx, dsn)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: schema version %d (%s); this binary knows up to %d%s\n", target, v, dirtyText(v, dirty, ""), bmdb.LatestVersion(),
		newerText(ctx, dsn, v, dirty, bmdb.LatestVersion(), nil))
	for _, e := range exts {
		v, dirty, err := migrate.ExtensionVersion(ctx, dsn, e)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: extension %s version %d (%s); this binary knows up to %d%s\n", target, e.Name, v, dirtyText(v, dirty, e.Name), e.Latest(),
			newerText(ctx, dsn, v, dirty, e.Latest(), e))
	}
	return nil
}

// newerText says, for a clean schema version newer than the binary's
// latest, whether the binary runs on it (its newer migrations are all
// declared compatible), and if not, what to run instead.
func newerText(ctx context.Context, dsn string, version uint, dirty bool, latest uint, ext *migrate.Extension) string {
	if dirty || version <= latest {
		return ""
	}
	if err := migrate.CheckNewerSchema(ctx, dsn, ext); err != nil {
		return "; this binary does not run on it: " + strings.TrimPrefix(err.Error(), migrate.ErrSchema.Error()+": ")
	}
	return "; this binary runs on it: every newer migration is declared compatible with the binaries before it"
}

func dirtyText(version uint, dirty bool, extension string) string {
	if dirty {
		return "dirty: " + migrate.DirtyAdvice(version, extension)
	}
	return "clean"
}

func migrateForce(ctx context.Context, dsn, target string, version uint, stdout io.Writer) error {
	if err := migrate.MigrateForce(ctx, dsn, version); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: schema version recorded as %d (clean); no migration was run\n", target, version)
	return nil
}

// poolerProbeTimeout bounds the check for a transaction pooler.
const poolerProbeTimeout = 20 * time.Second

// refuseTransactionPooler fails when dsn reaches PostgreSQL through a
// transaction-mode pooler (PgBouncer pool_mode=transaction). Migrations need
// a session: golang-migrate holds a session advisory lock while it runs,
// and through such a pooler the lock and its unlock reach different server
// connections, so the lock leaks and blocks every later migrate, direct
// ones included. Checked before any lock is taken.
func refuseTransactionPooler(ctx context.Context, dsn, target string) error {
	ctx, cancel := context.WithTimeout(ctx, poolerProbeTimeout)
	defer cancel()
	pooled, err := bmdb.TransactionPooled(ctx, dsn)
	if err != nil {
		return err
	}
	if pooled {
		return fmt.Errorf("%s is a transaction-mode pooler (e.g. PgBouncer pool_mode=transaction): migrations need a session of their own; "+
			"run migrate with a DSN that reaches the PostgreSQL primary directly (or a session-mode pool); the daemon itself works through the pooler", target)
	}
	return nil
}

// warnOlderSessions says, after 'migrate up' brought the schema to this
// binary's version, which live replicas run an older binary: the new
// migrations' gates bind them only as far as the database enforces them
// (docs/upgrading.md). Failing to look costs only the warning.
func warnOlderSessions(ctx context.Context, dsn string, version uint, out io.Writer) {
	if version != bmdb.LatestVersion() {
		return
	}
	sessions, total, err := migrate.OlderSessionsAt(context.WithoutCancel(ctx), dsn)
	if err != nil {
		fmt.Fprintf(out, "warning: %v\n", err)
		return
	}
	if w := migrate.OlderSessionsWarning(sessions, total); w != "" {
		fmt.Fprintln(out, w)
	}
}
