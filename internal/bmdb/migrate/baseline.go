package migrate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// BaselineVersion is the version of the baseline migration
// (migrations/0030_baseline.up.sql), which creates the whole schema: the
// first version of a new database. It replaced migrations 1 to 29, which
// were written before the first release, and is numbered after them so
// that binaries built before it read a baseline database as a newer schema
// whose migrations are declared compatible with them (it is the same
// schema) and keep running on it, instead of as an older one their
// 'migrate up' would apply their migration 2 onto (docs/upgrading.md).
const BaselineVersion = 30

// PreBaselineVersion is the version migrations 1 to 29 left a database at.
// 'migrate up' records such a database as the baseline without running it
// (adoptBaseline); one at an older version is first migrated to this one
// by a binary built before the baseline.
const PreBaselineVersion = BaselineVersion - 1

// PreBaselineCommit is a commit of Shepherd whose binary migrates a
// database to PreBaselineVersion, named in the errors that ask for one
// (and built by the test of the upgrade to the baseline).
const PreBaselineCommit = "362f158"

// replacedByBaseline reports whether version of e is one of the versions
// the baseline replaced: e is Shepherd's own schema, from the baseline on,
// and version is older than the baseline. Version 0 (nothing migrated) is
// not: the baseline creates that database's schema.
func (e *Extension) replacedByBaseline(version uint) bool {
	return e.own && e.Latest() >= BaselineVersion && version > 0 && version < BaselineVersion
}

// firstVersion is the oldest version among e's migrations: the one a new
// database starts at, and the one an up from no version applies first.
func (e *Extension) firstVersion() uint {
	if e.own && e.Latest() >= BaselineVersion {
		return BaselineVersion
	}
	return 1
}

// errPreBaseline is what an up, a down or a start says about a database
// at version, one of the versions the baseline replaced other than the
// last (adoptBaseline takes that one).
func errPreBaseline(version uint) error {
	return fmt.Errorf("%w: schema version %d predates the baseline schema (version %d), which this binary can take over only from version %d: migrate the database to version %d with a shepherd binary built before the baseline (e.g. from commit %s: 'go run ./cmd/shepherd migrate up'), then run this binary's 'shepherd migrate up' (docs/upgrading.md)",
		ErrSchema, version, BaselineVersion, PreBaselineVersion, PreBaselineVersion, PreBaselineCommit)
}

// adoptBaseline records a database that migrations 1 to 29 built (version
// PreBaselineVersion, clean) as the baseline, version BaselineVersion,
// without running the baseline: the schema is the baseline's (internal/
// bmdb's TestBaselineSchema compares them), and every row stays. In one
// transaction, holding golang-migrate's table against every other
// 'migrate', it checks that the schema has every table, column and
// function the baseline relies on (the recorded version alone could be a
// 'migrate force' on an empty database), drops the functions migrations 1
// to 29 left behind that no trigger calls any more (the baseline does not
// create them: an adopted database then has exactly its schema) and
// records the version. A concurrent 'migrate up' that adopted the database
// first leaves nothing to do.
func adoptBaseline(ctx context.Context, dsn string) error {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		timeout := strconv.FormatInt(MigrationLockTimeout.Milliseconds(), 10)
		if _, err := tx.Exec(ctx, qBaselineLockTimeout, timeout); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qBaselineLockVersions); err != nil {
			return fmt.Errorf("locking schema_migrations: %w", err)
		}
		var version int64
		var dirty bool
		if err := tx.QueryRow(ctx, qSchemaVersion).Scan(&version, &dirty); err != nil {
			return fmt.Errorf("reading the schema version: %w", err)
		}
		if version >= BaselineVersion {
			// Another 'migrate up' adopted it meanwhile, and may be
			// applying a later migration (dirty until it ends): the up
			// that follows waits for it under golang-migrate's lock, and
			// reports a migration that failed half-way.
			return nil
		}
		if version != PreBaselineVersion || dirty {
			return fmt.Errorf("schema version changed to %d (dirty %v) while migrating: run 'shepherd migrate up' again", version, dirty)
		}
		var missing []string
		if err := tx.QueryRow(ctx, qBaselineMissing).Scan(&missing); err != nil {
			return fmt.Errorf("checking the schema of version %d: %w", PreBaselineVersion, err)
		}
		if len(missing) > 3 {
			missing = append(missing[:3], fmt.Sprintf("%d more", len(missing)-3))
		}
		if len(missing) > 0 {
			return fmt.Errorf("%w: schema_migrations records version %d, but the schema lacks %s: it is not the schema Shepherd's migrations 1 to %d leave, and this binary does not record it as the baseline: repair it first, with a shepherd binary built before the baseline (e.g. from commit %s)",
				ErrSchema, PreBaselineVersion, strings.Join(missing, ", "), PreBaselineVersion, PreBaselineCommit)
		}
		if _, err := tx.Exec(ctx, qBaselineDropReplaced); err != nil {
			return fmt.Errorf("dropping the functions the baseline replaced: %w", err)
		}
		if _, err := tx.Exec(ctx, qBaselineRecord, int64(BaselineVersion)); err != nil {
			return fmt.Errorf("recording version %d: %w", BaselineVersion, err)
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrSchema) {
		return fmt.Errorf("taking over schema version %d as the baseline (version %d): %w", PreBaselineVersion, BaselineVersion, err)
	}
	return err
}
