package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

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

// MigrationLockTimeout bounds every lock wait of a migration: the
// migration lock another 'migrate' holds, and the table locks its DDL needs
// (an ALTER TABLE waits for every open transaction on the table). A
// migration that cannot get its locks fails after it, saying so, instead of
// hanging, and queueing every query of the running daemons behind it.
const MigrationLockTimeout = 30 * time.Second

// migrationConnectTimeout bounds connecting to the database to migrate it.
const migrationConnectTimeout = 10 * time.Second

// Extension is the schema of a process's own tables, shipped with the
// process (its Migrations field in the daemon's definition). Its
// migrations are golang-migrate files (NNNN_name.up.sql and
// NNNN_name.down.sql) at the root of FS, numbered on their own from 1 and
// tracked in a migrations table of their own, schema_migrations_<Name>, so
// that they never collide with Shepherd's or another extension's.
//
// Extensions are applied after Shepherd's schema and reverted before it, so
// their tables may have foreign keys to machines (ON DELETE CASCADE, so
// that deleting a machine deletes its tags).
type Extension struct {
	// Name identifies the extension: lower case letters, digits and
	// underscores, e.g. "firmwarecheck".
	Name string
	// FS holds the migration files, e.g. an embed.FS.
	FS fs.FS

	// own marks Shepherd's own schema (core): its migrations table is
	// golang-migrate's default and its declarations' name is ''. Only core
	// and the tests' copy of the migrations the baseline replaced set it.
	own bool
}

var extensionNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// Validate reports whether the extension can be applied.
func (e *Extension) Validate() error {
	if !extensionNameRE.MatchString(e.Name) {
		return fmt.Errorf("invalid extension name %q: want a lower-case letter followed by up to 39 lower-case letters, digits or underscores", e.Name)
	}
	if e.FS == nil {
		return fmt.Errorf("extension %s: no migrations (FS is nil)", e.Name)
	}
	if e.Latest() == 0 {
		return fmt.Errorf("extension %s: no NNNN_name.up.sql migration at the root of its FS", e.Name)
	}
	if _, err := e.Declarations(); err != nil {
		return err
	}
	return nil
}

// Table is the extension's migrations table.
func (e *Extension) Table() string { return "schema_migrations_" + e.Name }

// Latest is the newest version of the extension's migrations.
func (e *Extension) Latest() uint { return bmdb.LatestIn(e.FS) }

// core is Shepherd's own schema, as an extension without a name.
var core = &Extension{FS: migrations.FS, own: true}

func (e *Extension) table() string {
	if e.own {
		return migratepgx.DefaultMigrationsTable
	}
	return e.Table()
}

func (e *Extension) label() string {
	if e.own {
		return "BMDB"
	}
	return "extension " + e.Name
}

// migrator opens golang-migrate on ext's migrations. The caller closes it.
// Its connection carries a unique application_name, returned, by which
// cancelLockWait finds it. Opening takes the migration lock (to create the
// migrations table): a wait for it ends when ctx does.
func migrator(ctx context.Context, dsn string, ext *Extension) (*migrate.Migrate, string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, "", errors.New("invalid BMDB DSN: cannot parse it as a PostgreSQL URL or key=value string")
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = migrationConnectTimeout
	}
	if _, set := cfg.RuntimeParams["lock_timeout"]; !set {
		cfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(MigrationLockTimeout.Milliseconds(), 10)
	}
	app := "shepherd-migrate-" + strconv.FormatUint(rand.Uint64(), 36)
	cfg.RuntimeParams["application_name"] = app
	sqlDB := stdlib.OpenDB(*cfg)
	stop := context.AfterFunc(ctx, func() { cancelLockWait(dsn, app) })
	driver, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{MigrationsTable: ext.table()})
	stop()
	if err != nil {
		sqlDB.Close()
		if ctx.Err() != nil {
			return nil, "", fmt.Errorf("interrupted while waiting for the migration lock of %s: %w", ext.label(), ctx.Err())
		}
		return nil, "", fmt.Errorf("connecting to BMDB at %s for migration: %w", bmdb.RedactedTarget(cfg), err)
	}
	source, err := iofs.New(ext.FS, ".")
	if err != nil {
		driver.Close()
		return nil, "", fmt.Errorf("reading the migrations of %s: %w", ext.label(), err)
	}
	m, err := migrate.NewWithInstance("iofs", source, "pgx5", driver)
	if err != nil {
		return nil, "", fmt.Errorf("preparing the migrations of %s: %w", ext.label(), err)
	}
	// The server's lock_timeout ends the wait first, with its own error;
	// golang-migrate's timer would leave the wait running.
	m.LockTimeout = MigrationLockTimeout + 5*time.Second
	return m, app, nil
}

func closeMigrator(m *migrate.Migrate) {
	m.Close()
}

// run runs step (Up or Down) on m, honouring ctx: once ctx is done, a wait
// for the migration lock is cancelled (nothing has run yet), the migration
// in progress runs to its end (a migration interrupted half-way would leave
// the schema dirty), and no further one starts.
func run(ctx context.Context, dsn, app string, m *migrate.Migrate, step func() error) error {
	done := make(chan error, 1)
	go func() { done <- step() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		m.GracefulStop <- true
		cancelLockWait(dsn, app)
		err := <-done
		if err != nil && strings.Contains(err.Error(), "canceling statement due to user request") {
			return fmt.Errorf("interrupted while waiting for the migration lock: %w", ctx.Err())
		}
		if err == nil || errors.Is(err, migrate.ErrNoChange) {
			return fmt.Errorf("interrupted after the migration in progress: %w", ctx.Err())
		}
		return fmt.Errorf("interrupted (%w): %w", ctx.Err(), err)
	}
}

// cancelLockWait cancels the statement of the migration connection named
// app if, and only if, it is waiting for golang-migrate's advisory lock:
// then no migration has started. Best effort: a failure leaves the wait to
// end at the lock timeout.
func cancelLockWait(dsn, app string) {
	ctx, cancel := context.WithTimeout(context.Background(), migrationConnectTimeout)
	defer cancel()
	conn, err := connect(ctx, dsn)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, qCancelLockWait, app)
}

func checkExtensions(exts []*Extension) error {
	for _, e := range exts {
		if err := e.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// MigrateUp applies every migration the database lacks: Shepherd's, then
// those of exts in order. Running it on an up-to-date database is a no-op;
// concurrent runs are serialized by golang-migrate's advisory locks. When
// ctx is done it stops after the migration in progress.
func MigrateUp(ctx context.Context, dsn string, exts ...*Extension) error {
	if err := checkExtensions(exts); err != nil {
		return err
	}
	for _, e := range append([]*Extension{core}, exts...) {
		if err := migrateOne(ctx, dsn, e, (*migrate.Migrate).Up, "up"); err != nil {
			return err
		}
	}
	return nil
}

// migrateOne runs step (Up or Down, named dir) on e's migrations. Up on a
// schema newer than the binary's changes nothing: it succeeds when this
// binary may run on it (as CheckSchema decides), so that the migrate step
// of a rollback to the previous release passes, and fails naming the
// release to run otherwise.
//
// Up takes over a database that the migrations the baseline replaced
// built as the baseline (adoptBaseline), then applies what comes after it;
// it refuses an older one, as down refuses any of those versions, naming
// what to run instead (errPreBaseline).
//
// Up records the declarations of e's migrations both before it applies
// them, so that a binary started meanwhile finds the row of every version
// it sees applied, and after, since the migration that creates their
// table may be among those applied. Down forgets those of the versions it
// reverted.
func migrateOne(ctx context.Context, dsn string, e *Extension, step func(*migrate.Migrate) error, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	decls, err := e.Declarations()
	if err != nil {
		return err
	}
	m, app, err := migrator(ctx, dsn, e)
	if err != nil {
		return err
	}
	defer closeMigrator(m)
	version, dirty, verr := m.Version()
	clean := verr == nil && !dirty
	switch {
	case dir == "up" && clean && version > e.Latest():
		conn, err := connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return checkNewer(ctx, conn, e, version)
	case clean && e.replacedByBaseline(version) && version != PreBaselineVersion:
		return errPreBaseline(version)
	case clean && e.replacedByBaseline(version) && dir == "down":
		return fmt.Errorf("%w: schema version %d predates the baseline schema (version %d): run 'shepherd migrate up' first, which takes it over as the baseline, then 'migrate down'", ErrSchema, version, BaselineVersion)
	}
	if dir == "up" {
		if err := recordDeclarations(ctx, dsn, e, decls); err != nil {
			return err
		}
		if clean && e.replacedByBaseline(version) {
			if err := adoptBaseline(ctx, dsn); err != nil {
				return err
			}
		}
	}
	stepErr := run(ctx, dsn, app, m, func() error { return step(m) })
	if errors.Is(stepErr, migrate.ErrNoChange) {
		stepErr = nil
	}
	if stepErr != nil {
		stepErr = fmt.Errorf("migrating %s %s: %w", e.label(), dir, stepErr)
	}
	// What was applied is recorded even when a later migration failed, or
	// ctx ended after the one in progress.
	after := context.WithoutCancel(ctx)
	switch dir {
	case "up":
		err = recordDeclarations(after, dsn, e, decls)
	case "down":
		version, _, verr := m.Version()
		if errors.Is(verr, migrate.ErrNilVersion) {
			version, verr = 0, nil
		}
		if verr == nil {
			err = forgetDeclarations(after, dsn, e, version)
		}
	}
	return errors.Join(stepErr, err)
}

// MigrateDown reverts every migration, dropping all BMDB tables: those of
// exts first (last registered first), since they may reference Shepherd's,
// then Shepherd's. It refuses to drop Shepherd's tables while another
// extension, one not in exts, is still migrated: its foreign keys would
// make the drop fail half-way.
func MigrateDown(ctx context.Context, dsn string, exts ...*Extension) error {
	if err := checkExtensions(exts); err != nil {
		return err
	}
	for i := len(exts) - 1; i >= 0; i-- {
		if err := migrateOne(ctx, dsn, exts[i], (*migrate.Migrate).Down, "down"); err != nil {
			return err
		}
	}
	if err := refuseForeignExtensions(ctx, dsn); err != nil {
		return err
	}
	return migrateOne(ctx, dsn, core, (*migrate.Migrate).Down, "down")
}

// refuseForeignExtensions fails when an extension this binary does not know
// is still migrated: its migrations table exists with a version.
func refuseForeignExtensions(ctx context.Context, dsn string) error {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tables, err := bmdb.QueryRows(ctx, conn, pgx.RowTo[string], qExtensionTables)
	if err != nil {
		return fmt.Errorf("listing extension migrations: %w", err)
	}
	for _, t := range tables {
		var n int64
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{t}.Sanitize()).Scan(&n); err != nil {
			return fmt.Errorf("reading %s: %w", t, err)
		}
		if n > 0 {
			name := strings.TrimPrefix(t, "schema_migrations_")
			return fmt.Errorf("extension %s is still migrated (%s), and its tables may reference Shepherd's: run 'migrate down' with the binary that ships it first; Shepherd's tables were left as they are", name, t)
		}
	}
	return nil
}

func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("invalid BMDB DSN: cannot parse it as a PostgreSQL URL or key=value string")
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = migrationConnectTimeout
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to BMDB at %s: %w", bmdb.RedactedTarget(cfg), err)
	}
	return conn, nil
}

// MigrateForce records version as the database's clean schema version
// without running anything: the way out of a dirty state once an operator
// has repaired the schema by hand. Version 0 records that none is applied.
func MigrateForce(ctx context.Context, dsn string, version uint) error {
	m, _, err := migrator(ctx, dsn, core)
	if err != nil {
		return err
	}
	defer closeMigrator(m)
	if version > core.Latest() {
		return fmt.Errorf("cannot force version %d: this binary knows versions up to %d", version, core.Latest())
	}
	v := int(version)
	if version == 0 {
		v = -1 // golang-migrate's "no version": an up applies the baseline
	}
	if err := m.Force(v); err != nil {
		return fmt.Errorf("forcing BMDB schema version %d: %w", version, err)
	}
	return nil
}

// ExtensionForce is MigrateForce for ext's migrations; version 0 records
// that none is applied.
func ExtensionForce(ctx context.Context, dsn string, ext *Extension, version uint) error {
	if err := ext.Validate(); err != nil {
		return err
	}
	if version > ext.Latest() {
		return fmt.Errorf("cannot force version %d of extension %s: this binary knows versions up to %d", version, ext.Name, ext.Latest())
	}
	m, _, err := migrator(ctx, dsn, ext)
	if err != nil {
		return err
	}
	defer closeMigrator(m)
	v := int(version)
	if version == 0 {
		v = -1 // golang-migrate's "no version"
	}
	if err := m.Force(v); err != nil {
		return fmt.Errorf("forcing version %d of extension %s: %w", version, ext.Name, err)
	}
	return nil
}

// SchemaVersion returns the database's schema version (0 when never
// migrated) and whether a migration failed half-way (dirty).
func SchemaVersion(ctx context.Context, dsn string) (version uint, dirty bool, err error) {
	return schemaVersion(ctx, dsn, core)
}

// ExtensionVersion is SchemaVersion for ext's migrations.
func ExtensionVersion(ctx context.Context, dsn string, ext *Extension) (version uint, dirty bool, err error) {
	if err := ext.Validate(); err != nil {
		return 0, false, err
	}
	return schemaVersion(ctx, dsn, ext)
}

func schemaVersion(ctx context.Context, dsn string, e *Extension) (version uint, dirty bool, err error) {
	m, _, err := migrator(ctx, dsn, e)
	if err != nil {
		return 0, false, err
	}
	defer closeMigrator(m)
	version, dirty, err = m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		// golang-migrate reports no version, and hides that it is dirty,
		// when the down migration of the first version failed half-way
		// (it recorded version -1 dirty): read the flag itself, so that
		// 'migrate version' tells the truth (version 0, dirty).
		return 0, nilVersionDirty(ctx, dsn, e), nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading the schema version of %s: %w", e.label(), err)
	}
	return version, dirty, nil
}

// CheckSchema refuses to run against a schema this binary does not know: not
// migrated, older, dirty (a migration failed half-way), or newer (a newer
// binary migrated it) unless every newer migration is recorded compatible
// with the binaries before it, whether Shepherd's or one of exts'. The
// last is what lets a replica of the previous release restart during a
// rolling upgrade. Its errors say what to do, and for a newer schema name
// the release to run.
//
// It is checked at start only: a schema moved ahead while the binary runs
// is one its operator declared it may run on, or one whose release notes
// say to stop the binaries before it first (docs/upgrading.md).
func CheckSchema(ctx context.Context, db *bmdb.DB, exts ...*Extension) error {
	for _, e := range append([]*Extension{core}, exts...) {
		if err := checkSchema(ctx, db, e); err != nil {
			return err
		}
	}
	return nil
}

// nilVersionDirty reports whether e's migrations table records no version
// but dirty: the down migration of version 1 failed half-way. Any error
// reads as no.
func nilVersionDirty(ctx context.Context, dsn string, e *Extension) bool {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false
	}
	defer conn.Close(ctx)
	var version int64
	var dirty bool
	q := "SELECT version, dirty FROM " + pgx.Identifier{e.table()}.Sanitize() + " LIMIT 1"
	if err := conn.QueryRow(ctx, q).Scan(&version, &dirty); err != nil {
		return false
	}
	return version < 0 && dirty
}

// DirtyAdvice says how to recover from a migration that failed half-way,
// given the version recorded dirty (0 when the down migration of the first
// version failed): commands an operator can run as they are. golang-migrate
// records the version a migration leads to as dirty before running it, and
// PostgreSQL rolls the failed migration back, so the schema is at the
// version before that step: the one below after a failed up (none below
// the first version: 0), the one above after a failed down. The first
// version of Shepherd's schema (extension "") is the baseline's; an
// extension's is 1.
func DirtyAdvice(version uint, extension string) string {
	ext := ""
	first := uint(1)
	if extension != "" {
		ext = " -extension " + extension
	} else {
		first = core.firstVersion()
	}
	if version == 0 {
		return fmt.Sprintf("reverting version %d failed half-way (migrate down) and was rolled back: fix what made it fail, then run 'shepherd migrate%s force %d' and 'shepherd migrate down -yes' again", first, ext, first)
	}
	before := version - 1
	if version == first {
		before = 0
	}
	return fmt.Sprintf("a migration failed half-way and was rolled back: fix what made it fail; if it was 'migrate up' (to version %d), run 'shepherd migrate%s force %d', then 'shepherd migrate up'; if it was 'migrate down', run 'shepherd migrate%s force %d', then 'shepherd migrate down -yes'",
		version, ext, before, ext, version+1)
}

func checkSchema(ctx context.Context, db *bmdb.DB, e *Extension) error {
	var version int64
	var dirty bool
	q := qSchemaVersion
	if !e.own {
		if err := e.Validate(); err != nil {
			return err
		}
		q = "SELECT version, dirty FROM " + pgx.Identifier{e.Table()}.Sanitize() + " LIMIT 1"
	}
	err := db.Pool().QueryRow(ctx, q).Scan(&version, &dirty)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01", errors.Is(err, pgx.ErrNoRows), errors.Is(err, sql.ErrNoRows):
		if e.own {
			return fmt.Errorf("%w: the database has no Shepherd schema; run 'shepherd migrate up' against it first", ErrSchema)
		}
		return fmt.Errorf("%w: the database lacks the tables of %s; run 'migrate up' with this binary first", ErrSchema, e.label())
	case err != nil:
		return fmt.Errorf("reading the schema version of %s: %w", e.label(), err)
	}
	latest := e.Latest()
	name := "schema"
	if !e.own {
		name = e.label() + " schema"
	}
	switch {
	case dirty:
		extName := ""
		if !e.own {
			extName = e.Name
		}
		return fmt.Errorf("%w: %s version %d is dirty: %s", ErrSchema, name, max(version, 0), DirtyAdvice(uint(max(version, 0)), extName))
	case uint(version) > latest:
		return checkNewer(ctx, db.Pool(), e, uint(version))
	case e.replacedByBaseline(uint(version)) && uint(version) != PreBaselineVersion:
		return errPreBaseline(uint(version))
	case uint(version) < latest:
		return fmt.Errorf("%w: %s version %d is older than this binary's %d; run 'shepherd migrate up' first", ErrSchema, name, version, latest)
	}
	return nil
}

// qExtensionTables lists the migrations tables of extensions, by the name
// Extension.Table gives them.
const qExtensionTables = `
SELECT tablename::text FROM pg_tables
WHERE schemaname = current_schema() AND tablename LIKE 'schema\_migrations\_%'
ORDER BY tablename`

// qCancelLockWait cancels a migration connection's wait for golang-migrate's
// advisory lock, and nothing else it might be running.
const qCancelLockWait = `
SELECT pg_cancel_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'
  AND query LIKE 'SELECT pg_advisory_lock(%'`
