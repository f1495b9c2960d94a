package migrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Declaration is what a migration's .up.sql file says about itself, in
// lines of their own:
//
//	-- shepherd: compatible-with-previous
//	-- shepherd: gate enforced-in-database
//	-- shepherd: incompatible-before 18: WHY
//	-- shepherd: incompatible: WHY
//	-- shepherd: release v1.4
//
// 'migrate up' records it in the database (table migration_declarations),
// because the binaries it matters to are the older ones, whose embedded
// files do not include the migration: a binary started on a schema newer
// than its own runs exactly when every newer migration is recorded
// compatible with the binaries of its previous schema version.
//
// A migration that adds or changes a safety gate (a hold, a budget, a
// cancel, anything that keeps a process off a machine) says how binaries
// that do not know the gate are kept to it: "gate enforced-in-database"
// (the database refuses what they would do against it: a trigger, a
// constraint), or it is no expand step ("incompatible: WHY"), or it
// retracts the compatibility of the older binaries it cannot bind
// ("incompatible-before N: WHY").
type Declaration struct {
	// Version is the migration's, from its file name.
	Version uint
	// CompatibleWithPrevious says that binaries of schema Version-1 may
	// keep running on Version: the migration only adds what they do not
	// notice (an expand step), or binds them to what they would notice
	// through the database (Gate). Without it the migration is a contract
	// step, and they refuse to start on it.
	CompatibleWithPrevious bool
	// Gate is "enforced-in-database" when the migration makes a safety
	// gate binding on binaries that do not know it ("" when it declares
	// none). It requires CompatibleWithPrevious: a contract step needs no
	// such promise, its older binaries refuse to start.
	Gate string
	// Incompatible is why the migration is a contract step, when its file
	// says so explicitly ("" otherwise). It is for the reader: older
	// binaries read only that the migration is not compatible.
	Incompatible string
	// RefuseBefore, when not 0, is a schema version below Version whose
	// binaries must not run on this schema: they ignore a gate that the
	// database cannot make binding. 'migrate up' records version
	// RefuseBefore as not compatible with the binaries before it, which
	// is what those binaries read at start. RefuseWhy says why.
	RefuseBefore uint
	RefuseWhy    string
	// Release names the release that brings the migration ("" if the file
	// names none), so that a binary too old to run on it says which
	// release to run instead.
	Release string
}

// GateEnforcedInDatabase is the one value of a gate declaration.
const GateEnforcedInDatabase = "enforced-in-database"

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
		if d.RefuseBefore >= d.Version {
			return nil, fmt.Errorf("migration %s of %s: incompatible-before %d names a version that is not before its own", name, e.label(), d.RefuseBefore)
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Declaration) int { return int(a.Version) - int(b.Version) })
	return out, nil
}

// declarationForms lists the declarations a migration may make, for
// error messages.
var declarationForms = []string{
	declarationPrefix + " compatible-with-previous",
	declarationPrefix + " gate " + GateEnforcedInDatabase,
	declarationPrefix + " incompatible: WHY",
	declarationPrefix + " incompatible-before VERSION: WHY",
	declarationPrefix + " release NAME",
}

// parseDeclaration reads the declaration lines of one migration file.
func parseDeclaration(text string) (Declaration, error) {
	var d Declaration
	seen := map[string]bool{}
	want := "want one of " + strings.Join(declarationForms, ", ")
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, declarationPrefix)
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return d, fmt.Errorf("line %d: %q declares nothing: %s", i+1, line, want)
		}
		key := strings.TrimSuffix(fields[0], ":")
		if seen[key] {
			return d, fmt.Errorf("line %d: %s declared twice", i+1, key)
		}
		seen[key] = true
		if err := d.parseLine(fields, rest); err != nil {
			return d, fmt.Errorf("line %d: %q is not a declaration this binary knows (%v); %s", i+1, line, err, want)
		}
	}
	switch {
	case d.Gate != "" && !d.CompatibleWithPrevious:
		return d, fmt.Errorf("gate %s declared without compatible-with-previous: a contract step binds no older binary, it refuses them", d.Gate)
	case d.Incompatible != "" && d.CompatibleWithPrevious:
		return d, errors.New("declared both compatible-with-previous and incompatible")
	}
	return d, nil
}

// parseLine reads one declaration line: fields are its words after the
// prefix, rest the text after the prefix.
func (d *Declaration) parseLine(fields []string, rest string) error {
	switch {
	case fields[0] == "compatible-with-previous" && len(fields) == 1:
		d.CompatibleWithPrevious = true
	case fields[0] == "gate" && len(fields) == 2 && fields[1] == GateEnforcedInDatabase:
		d.Gate = fields[1]
	case fields[0] == "release" && len(fields) == 2 && releaseRE.MatchString(fields[1]):
		d.Release = fields[1]
	case fields[0] == "release":
		return errors.New("a release is a name of letters, digits and ._+- up to 64 characters")
	case fields[0] == "incompatible:":
		_, why, _ := strings.Cut(rest, ":")
		if d.Incompatible = strings.TrimSpace(why); d.Incompatible == "" {
			return errors.New("incompatible: says why")
		}
	case fields[0] == "incompatible-before" && len(fields) >= 3 && strings.HasSuffix(fields[1], ":"):
		v, err := strconv.ParseUint(strings.TrimSuffix(fields[1], ":"), 10, 32)
		if err != nil || v < 2 {
			return fmt.Errorf("incompatible-before takes a schema version of at least 2, not %q", fields[1])
		}
		_, why, _ := strings.Cut(rest, ":")
		d.RefuseBefore, d.RefuseWhy = uint(v), strings.TrimSpace(why)
	case fields[0] == "incompatible-before":
		return errors.New("incompatible-before takes a version, a colon and why")
	default:
		return errors.New("not a declaration")
	}
	return nil
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
	recorded := recordedForm(decls)
	return withDeclarations(ctx, dsn, func(conn *pgx.Conn) error {
		versions := make([]int64, len(recorded))
		compatible := make([]bool, len(recorded))
		releases := make([]string, len(recorded))
		for i, d := range recorded {
			versions[i], compatible[i], releases[i] = int64(d.Version), d.CompatibleWithPrevious, d.Release
		}
		if _, err := conn.Exec(ctx, qRecordDeclarations, e.schemaName(), versions, compatible, releases); err != nil {
			return fmt.Errorf("recording the declarations of the migrations of %s: %w", e.label(), err)
		}
		return nil
	})
}

// recordedForm is what migration_declarations records of decls, the
// declarations of one schema's files: each as declared, except that a
// version named by a later migration's incompatible-before is recorded
// not compatible with the binaries before it, since that is what those
// binaries read at start (a version no file declares any more, as after
// a squash of old migrations, gets a row of its own).
func recordedForm(decls []Declaration) []Declaration {
	out := slices.Clone(decls)
	for _, d := range decls {
		if d.RefuseBefore == 0 {
			continue
		}
		i := slices.IndexFunc(out, func(o Declaration) bool { return o.Version == d.RefuseBefore })
		if i < 0 {
			out = append(out, Declaration{Version: d.RefuseBefore})
			continue
		}
		out[i].CompatibleWithPrevious = false
	}
	return out
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
func checkNewer(ctx context.Context, q bmdb.Queryer, e *Extension, version uint) error {
	latest := e.Latest()
	recorded := map[uint]Declaration{}
	rows, err := bmdb.QueryRows(ctx, q, pgx.RowToStructByPos[recordedDeclaration], qNewerDeclarations, e.schemaName(), int64(latest), int64(version))
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
