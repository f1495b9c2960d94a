package daemon

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

const migrateUsage = `Usage: shepherd migrate [flags] up|down|version|force N

  up        apply every migration the database lacks (no-op when current)
  down      revert every migration: DROPS ALL SHEPHERD TABLES AND DATA;
            refuses to run without -yes
  version   print the schema version, and whether it is dirty
  force N   record N as the clean schema version without running anything,
            after repairing a dirty (half-applied) migration by hand

Flags may come before or after the action.
`

// runMigrate is the migrate subcommand.
func runMigrate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shepherd migrate", flag.ContinueOnError)
	var dsnf dsnFlags
	dsnf.register(fs)
	yes := fs.Bool("yes", false, "confirm 'migrate down', which drops every Shepherd table and all fleet data")

	// Flags may follow the action ("migrate up -bmdb_dsn ..."): parse, take
	// the positional arguments, and parse what follows them again.
	var positional []string
	for {
		help, err := parseFlags(fs, args)
		if help {
			fmt.Fprint(stdout, migrateUsage+"\nFlags:\n")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return exitOK
		}
		if err != nil {
			return reportUsage(stderr, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}

	action, err := migrateAction(positional)
	if err != nil {
		return reportUsage(stderr, err)
	}
	dsn, err := dsnf.resolve()
	if err != nil {
		return reportUsage(stderr, err)
	}
	if dsn == "" {
		return reportUsage(stderr, usagef("migrate: no database: give -bmdb_dsn, -bmdb_dsn_file or $%s", envDSN))
	}
	if positional[0] == "down" && !*yes {
		return reportUsage(stderr, usagef("migrate down drops every Shepherd table and all fleet data (machines, leases, backoffs, history); add -yes to confirm"))
	}
	target, _ := describeDSN(dsn)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if positional[0] != "version" {
		if err := refuseTransactionPooler(ctx, dsn, target); err != nil {
			fmt.Fprintf(stderr, "shepherd: migrate: %v\n", err)
			return exitFailure
		}
	}
	if err := action(ctx, dsn, target, stdout); err != nil {
		fmt.Fprintf(stderr, "shepherd: migrate: %v\n", err)
		return exitFailure
	}
	return exitOK
}

type migrateFunc func(ctx context.Context, dsn, target string, stdout io.Writer) error

// migrateAction checks the positional arguments and returns what to do.
func migrateAction(pos []string) (migrateFunc, error) {
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
		if uint(v) > bmdb.LatestVersion() {
			return nil, usagef("migrate force %d: this binary knows schema versions up to %d", v, bmdb.LatestVersion())
		}
		fn = func(ctx context.Context, dsn, target string, stdout io.Writer) error {
			return migrateForce(ctx, dsn, target, uint(v), stdout)
		}
	default:
		return nil, usagef("migrate: unknown action %q: want up, down, version or force N", pos[0])
	}
	if len(pos) > want {
		return nil, usagef("migrate %s: unexpected argument %q", pos[0], pos[want])
	}
	return fn, nil
}

func migrateUp(ctx context.Context, dsn, target string, stdout io.Writer) error {
	from, _, err := bmdb.SchemaVersion(ctx, dsn)
	if err != nil {
		return err
	}
	if err := bmdb.MigrateUp(ctx, dsn); err != nil {
		return err
	}
	to, _, err := bmdb.SchemaVersion(ctx, dsn)
	if err != nil {
		return err
	}
	if from == to {
		fmt.Fprintf(stdout, "%s: schema already at version %d, nothing to do\n", target, to)
	} else {
		fmt.Fprintf(stdout, "%s: migrated schema from version %d to %d\n", target, from, to)
	}
	return nil
}

func migrateDown(ctx context.Context, dsn, target string, stdout io.Writer) error {
	from, _, err := bmdb.SchemaVersion(ctx, dsn)
	if err != nil {
		return err
	}
	if err := bmdb.MigrateDown(ctx, dsn); err != nil {
		return err
	}
	if from == 0 {
		fmt.Fprintf(stdout, "%s: schema was not migrated, nothing to do\n", target)
	} else {
		fmt.Fprintf(stdout, "%s: migrated schema down from version %d to 0: every Shepherd table and its data is gone\n", target, from)
	}
	return nil
}

func migrateVersion(ctx context.Context, dsn, target string, stdout io.Writer) error {
	v, dirty, err := bmdb.SchemaVersion(ctx, dsn)
	if err != nil {
		return err
	}
	state := "clean"
	if dirty {
		state = "dirty: a migration failed half-way; repair it by hand, then 'shepherd migrate force N'"
	}
	fmt.Fprintf(stdout, "%s: schema version %d (%s); this binary knows up to %d\n", target, v, state, bmdb.LatestVersion())
	return nil
}

func migrateForce(ctx context.Context, dsn, target string, version uint, stdout io.Writer) error {
	if err := bmdb.MigrateForce(ctx, dsn, version); err != nil {
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
