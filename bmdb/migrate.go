package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/shepherd-fleet/shepherd/migrations"
)

// ErrSchema is wrapped by the errors of CheckSchema: the database's schema
// is not one this binary can run against.
var ErrSchema = errors.New("BMDB schema mismatch")

// LatestVersion is the newest schema version this binary knows.
func LatestVersion() uint {
	var latest uint
	entries, _ := fs.ReadDir(migrations.FS, ".")
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		if !ok {
			continue
		}
		if v, err := strconv.ParseUint(prefix, 10, 32); err == nil && uint(v) > latest {
			latest = uint(v)
		}
	}
	return latest
}

// migrator opens golang-migrate on the embedded migrations. The caller
// closes it.
func migrator(dsn string) (*migrate.Migrate, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("invalid BMDB DSN: cannot parse it as a PostgreSQL URL or key=value string")
	}
	sqlDB := stdlib.OpenDB(*cfg)
	driver, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{})
	if err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("connecting to BMDB at %s for migration: %w", redactedTarget(cfg), err)
	}
	source, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", source, "pgx5", driver)
	if err != nil {
		return nil, fmt.Errorf("preparing migrations: %w", err)
	}
	return m, nil
}

func closeMigrator(m *migrate.Migrate) {
	m.Close()
}

// MigrateUp applies every migration the database lacks. Running it on an
// up-to-date database is a no-op; concurrent runs are serialized by
// golang-migrate's advisory lock.
func MigrateUp(ctx context.Context, dsn string) error {
	m, err := migrator(dsn)
	if err != nil {
		return err
	}
	defer closeMigrator(m)
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrating BMDB up: %w", err)
	}
	return nil
}

// MigrateDown reverts every migration, dropping all BMDB tables.
func MigrateDown(ctx context.Context, dsn string) error {
	m, err := migrator(dsn)
	if err != nil {
		return err
	}
	defer closeMigrator(m)
	if err := m.Down(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrating BMDB down: %w", err)
	}
	return nil
}

// MigrateForce records version as the database's clean schema version
// without running anything: the way out of a dirty state once an operator
// has repaired the schema by hand.
func MigrateForce(ctx context.Context, dsn string, version uint) error {
	m, err := migrator(dsn)
	if err != nil {
		return err
	}
	defer closeMigrator(m)
	if version > LatestVersion() {
		return fmt.Errorf("cannot force version %d: this binary knows versions up to %d", version, LatestVersion())
	}
	if err := m.Force(int(version)); err != nil {
		return fmt.Errorf("forcing BMDB schema version %d: %w", version, err)
	}
	return nil
}

// SchemaVersion returns the database's schema version (0 when never
// migrated) and whether a migration failed half-way (dirty).
func SchemaVersion(ctx context.Context, dsn string) (version uint, dirty bool, err error) {
	m, err := migrator(dsn)
	if err != nil {
		return 0, false, err
	}
	defer closeMigrator(m)
	version, dirty, err = m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading BMDB schema version: %w", err)
	}
	return version, dirty, nil
}

// CheckSchema refuses to run against a schema this binary does not know: not
// migrated, older, newer (a newer binary migrated it), or dirty (a migration
// failed half-way). Its errors say what to do.
func (db *DB) CheckSchema(ctx context.Context) error {
	var version int64
	var dirty bool
	err := db.pool.QueryRow(ctx, qSchemaVersion).Scan(&version, &dirty)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01", errors.Is(err, pgx.ErrNoRows), errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: the database has no Shepherd schema; run 'shepherd migrate up' against it first", ErrSchema)
	case err != nil:
		return fmt.Errorf("reading BMDB schema version: %w", err)
	}
	latest := LatestVersion()
	switch {
	case dirty:
		return fmt.Errorf("%w: schema version %d is dirty (a migration failed half-way); finish or undo that migration by hand, then run 'shepherd migrate force %d' (or the version you restored)", ErrSchema, version, version)
	case uint(version) > latest:
		return fmt.Errorf("%w: schema version %d is newer than this binary knows (%d); run a shepherd release that knows version %d, or 'shepherd migrate down' with the newer binary", ErrSchema, version, latest, version)
	case uint(version) < latest:
		return fmt.Errorf("%w: schema version %d is older than this binary's %d; run 'shepherd migrate up' first", ErrSchema, version, latest)
	}
	return nil
}
