package bmdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Declaration is what a migration's .up.sql file says about itself, in
// lines of their own:
//
//	-- shepherd: compatible-with-previous
//	-- shepherd: release v1.4
//
// 'migrate up' records it in the database (table migration_declarations),
// because the binaries it matters to are the older ones, whose embedded
// files do not include the migration: a binary started on a schema newer
// than its own runs exactly when every newer migration is recorded
// compatible with the binaries of its previous schema version.
type Declaration struct {
	// Version is the migration's, from its file name.
	Version uint
	// CompatibleWithPrevious says that binaries of schema Version-1 may
	// keep running on Version: the migration only adds what they do not
	// notice (an expand step). Without it the migration is a contract
	// step, and they refuse to start on it.
	CompatibleWithPrevious bool
	// Release names the release that brings the migration ("" if the file
	// names none), so that a binary too old to run on it says which
	// release to run instead.
	Release string
}

// declarationPrefix starts every declaration line.
const declarationPrefix = "-- shepherd:"

// releaseRE is what a release name may be: short, printable, no spaces,
// since it is printed in one-line messages.
var releaseRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$`)

// Declarations parses the declarations of Shepherd's own migrations, in
// version order.
func Declarations() ([]Declaration, error) { return core.Declarations() }

// Declarations parses the declarations of the extension's migrations, in
// version order. A line that starts "-- shepherd:" and is not a
// declaration this binary knows is an error, so that a typo does not
// silently declare a migration a contract step.
func (e *Extension) Declarations() ([]Declaration, error) {
	entries, err := fs.ReadDir(e.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("reading the migrations of %s: %w", e.label(), err)
	}
	var out []Declaration
	for _, entry := range entries {
		name := entry.Name()
		prefix, _, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(name, ".up.sql") {
			continue
		}
		v, err := strconv.ParseUint(prefix, 10, 32)
		if err != nil {
			continue // not a migration golang-migrate reads either
		}
		text, err := fs.ReadFile(e.FS, name)
		if err != nil {
			return nil, fmt.Errorf("reading migration %s of %s: %w", name, e.label(), err)
		}
		d, err := parseDeclaration(string(text))
		if err != nil {
			return nil, fmt.Errorf("migration %s of %s: %w", name, e.label(), err)
		}
		d.Version = uint(v)
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Declaration) int { return int(a.Version) - int(b.Version) })
	return out, nil
}

// parseDeclaration reads the declaration lines of one migration file.
func parseDeclaration(text string) (Declaration, error) {
	var d Declaration
	seen := map[string]bool{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, declarationPrefix)
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return d, fmt.Errorf("line %d: %q declares nothing: want %q or %q", i+1, line, declarationPrefix+" compatible-with-previous", declarationPrefix+" release NAME")
		}
		if seen[fields[0]] {
			return d, fmt.Errorf("line %d: %s declared twice", i+1, fields[0])
		}
		seen[fields[0]] = true
		switch {
		case fields[0] == "compatible-with-previous" && len(fields) == 1:
			d.CompatibleWithPrevious = true
		case fields[0] == "release" && len(fields) == 2 && releaseRE.MatchString(fields[1]):
			d.Release = fields[1]
		case fields[0] == "release":
			return d, fmt.Errorf("line %d: %q: want %q, a name of letters, digits and ._+- up to 64 characters", i+1, line, declarationPrefix+" release NAME")
		default:
			return d, fmt.Errorf("line %d: %q is not a declaration: want %q or %q", i+1, line, declarationPrefix+" compatible-with-previous", declarationPrefix+" release NAME")
		}
	}
	return d, nil
}

// schemaName is e's key in migration_declarations.
func (e *Extension) schemaName() string {
	if e.own {
		return ""
	}
	return e.Name
}

// recordDeclarations records decls, e's, in migration_declarations if the
// table exists. Each release records its files' declarations, replacing
// what an earlier one recorded for the same version: a later release may
// correct a declaration.
func recordDeclarations(ctx context.Context, dsn string, e *Extension, decls []Declaration) error {
	return withDeclarations(ctx, dsn, func(conn *pgx.Conn) error {
		versions := make([]int64, len(decls))
		compatible := make([]bool, len(decls))
		releases := make([]string, len(decls))
		for i, d := range decls {
			versions[i], compatible[i], releases[i] = int64(d.Version), d.CompatibleWithPrevious, d.Release
		}
		if _, err := conn.Exec(ctx, qRecordDeclarations, e.schemaName(), versions, compatible, releases); err != nil {
			return fmt.Errorf("recording the declarations of the migrations of %s: %w", e.label(), err)
		}
		return nil
	})
}

// forgetDeclarations deletes the recorded declarations of e's versions
// above version, after a migrate down: the versions are no longer applied,
// and the next 'migrate up' records its own.
func forgetDeclarations(ctx context.Context, dsn string, e *Extension, version uint) error {
	return withDeclarations(ctx, dsn, func(conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, qForgetDeclarations, e.schemaName(), int64(version)); err != nil {
			return fmt.Errorf("forgetting the declarations of reverted migrations of %s: %w", e.label(), err)
		}
		return nil
	})
}

// withDeclarations runs fn on a connection to dsn if the migration
// declarations table exists (a migration creates it, so an older schema
// has none and there is nothing to record or forget).
func withDeclarations(ctx context.Context, dsn string, fn func(conn *pgx.Conn) error) error {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, qDeclarationsExist).Scan(&exists); err != nil {
		return fmt.Errorf("looking for the migration declarations table: %w", err)
	}
	if !exists {
		return nil
	}
	return fn(conn)
}

// checkNewer decides whether this binary, which knows e's versions up to
// e.Latest(), may run on the database's version, a newer one: exactly when
// every version above its own is recorded compatible with the binaries of
// the version before it. Its error (wrapping ErrSchema) names the release
// to run instead: the one of the newest version that is not compatible,
// since a binary that knows that version runs on the ones after it.
func checkNewer(ctx context.Context, q queryer, e *Extension, version uint) error {
	latest := e.Latest()
	recorded := map[uint]Declaration{}
	rows, err := queryRows(ctx, q, pgx.RowToStructByPos[recordedDeclaration], qNewerDeclarations, e.schemaName(), int64(latest), int64(version))
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01":
		// No table: nothing was recorded, and nothing is compatible.
	case err != nil:
		return fmt.Errorf("reading the declarations of the newer migrations of %s: %w", e.label(), err)
	}
	for _, r := range rows {
		recorded[uint(r.Version)] = Declaration{Version: uint(r.Version), CompatibleWithPrevious: r.Compatible, Release: r.Release}
	}
	name := "schema"
	if !e.own {
		name = e.label() + " schema"
	}
	newer := fmt.Sprintf("%s version %d is newer than this binary knows (%d)", name, version, latest)
	for v := version; v > latest; v-- {
		d, ok := recorded[v]
		if !ok {
			return fmt.Errorf("%w: %s, and migration %d declares nothing this binary can read (no row in migration_declarations: it was applied by a release before declarations, or a 'migrate up' stopped before recording them); run a shepherd release that knows version %d, or 'shepherd migrate down' with the newer binary",
				ErrSchema, newer, v, v)
		}
		if d.CompatibleWithPrevious {
			continue
		}
		release := fmt.Sprintf("a shepherd release that knows version %d", v)
		if d.Release != "" {
			release = fmt.Sprintf("release %s or later (it knows version %d)", d.Release, v)
		}
		return fmt.Errorf("%w: %s, and migration %d is not compatible with binaries of the schema before it (a contract step); run %s", ErrSchema, newer, v, release)
	}
	return nil
}

// recordedDeclaration is a row of qNewerDeclarations.
type recordedDeclaration struct {
	Version    int64
	Compatible bool
	Release    string
}

// CheckNewerSchema reports, for a database whose schema (ext's, or
// Shepherd's if ext is nil) is newer than this binary knows, whether this
// binary may run on it: nil when every newer migration is recorded
// compatible with the binaries before it, else an error wrapping
// ErrSchema that names the release to run. It is what CheckSchema
// decides for a newer schema, for 'migrate version' to explain.
func CheckNewerSchema(ctx context.Context, dsn string, ext *Extension) error {
	e := core
	if ext != nil {
		if err := ext.Validate(); err != nil {
			return err
		}
		e = ext
	}
	version, dirty, err := schemaVersion(ctx, dsn, e)
	if err != nil {
		return err
	}
	if dirty || version <= e.Latest() {
		return fmt.Errorf("%s version %d is not newer than this binary's %d", e.label(), version, e.Latest())
	}
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return checkNewer(ctx, conn, e, version)
}

// qDeclarationsExist says whether migration 15 has created the table of
// declarations.
const qDeclarationsExist = `SELECT to_regclass('migration_declarations') IS NOT NULL`

// qRecordDeclarations records one schema's declarations ($1: its name; $2,
// $3, $4: the versions, flags and releases).
const qRecordDeclarations = `
INSERT INTO migration_declarations (schema_name, version, compatible_with_previous, release)
SELECT $1::text, d.version, d.compatible, d.release
FROM unnest($2::bigint[], $3::boolean[], $4::text[]) AS d (version, compatible, release)
ON CONFLICT (schema_name, version) DO UPDATE
SET compatible_with_previous = EXCLUDED.compatible_with_previous, release = EXCLUDED.release, recorded_at = now()
WHERE (migration_declarations.compatible_with_previous, migration_declarations.release)
    IS DISTINCT FROM (EXCLUDED.compatible_with_previous, EXCLUDED.release)`

// qForgetDeclarations deletes one schema's declarations above a version.
const qForgetDeclarations = `DELETE FROM migration_declarations WHERE schema_name = $1 AND version > $2`

// qNewerDeclarations reads one schema's declarations of the versions in
// ($2, $3]: those newer than the binary's, up to the database's.
const qNewerDeclarations = `
SELECT version, compatible_with_previous, release FROM migration_declarations
WHERE schema_name = $1 AND version > $2 AND version <= $3
ORDER BY version`
