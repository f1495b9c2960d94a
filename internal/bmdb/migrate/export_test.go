package migrate

import (
	"context"
	"os"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/golang-migrate/migrate/v4"
)

// preBaseline is Shepherd's schema as migrations 1 to 29 built it before
// the baseline replaced them: their files, kept as test data only
// (testdata/premigrations), read as Shepherd's own schema, as a binary
// built before the baseline embedded them.
func preBaseline() *Extension {
	return &Extension{FS: os.DirFS("testdata/premigrations"), own: true}
}

// MigrateUpPreBaseline is 'migrate up' of a binary built before the
// baseline: it builds a database as those binaries did (with their
// declarations recorded), and shows what they do with a newer one.
func MigrateUpPreBaseline(ctx context.Context, dsn string) error {
	return migrateOne(ctx, dsn, preBaseline(), (*migrate.Migrate).Up, "up")
}

// CheckSchemaPreBaseline is CheckSchema of a binary built before the
// baseline: whether such a binary starts on the database.
func CheckSchemaPreBaseline(ctx context.Context, db *bmdb.DB) error {
	return checkSchema(ctx, db, preBaseline())
}
