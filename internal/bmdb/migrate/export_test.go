package migrate

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path"
	"strings"
	"sync"
	"testing/fstest"

	"github.com/golang-migrate/migrate/v4"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// preBaselineFiles reads migrations 1 to 29 from the repository's git
// history, once per test binary: the history is their one copy, so the
// tree does not carry them a second time as test data.
var preBaselineFiles = sync.OnceValues(func() (fstest.MapFS, error) {
	top, err := gitOutput("rev-parse", "--show-toplevel")
	if err != nil {
		return nil, err
	}
	out, err := gitOutput("-C", strings.TrimSpace(string(top)), "archive", "--format=tar", PreBaselineCommit+":migrations")
	if err != nil {
		return nil, err
	}
	files := fstest.MapFS{}
	r := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading migrations of commit %s: %w", PreBaselineCommit, err)
		}
		if h.Typeflag != tar.TypeReg || path.Ext(h.Name) != ".sql" || strings.Contains(h.Name, "/") {
			continue
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return nil, fmt.Errorf("reading %s of commit %s: %w", h.Name, PreBaselineCommit, err)
		}
		files[h.Name] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("commit %s has no migrations/*.sql: needs the repository's full git history", PreBaselineCommit)
	}
	return files, nil
})

// gitOutput runs git with args and returns its output, or an error saying that
// the tests need the repository's history.
func gitOutput(args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("git", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("needs the repository's git history (commit %s): run from a full clone: git %s: %w: %s",
			PreBaselineCommit, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// preBaseline is Shepherd's schema as migrations 1 to 29 built it before
// the baseline replaced them (read from git history, see
// preBaselineFiles), read as Shepherd's own schema, as a binary built
// before the baseline embedded them.
func preBaseline() (*Extension, error) {
	files, err := preBaselineFiles()
	if err != nil {
		return nil, err
	}
	return &Extension{FS: files, own: true}, nil
}

// MigrateUpPreBaseline is 'migrate up' of a binary built before the
// baseline: it builds a database as those binaries did (with their
// declarations recorded), and shows what they do with a newer one.
func MigrateUpPreBaseline(ctx context.Context, dsn string) error {
	ext, err := preBaseline()
	if err != nil {
		return err
	}
	return migrateOne(ctx, dsn, ext, (*migrate.Migrate).Up, "up")
}

// CheckSchemaPreBaseline is CheckSchema of a binary built before the
// baseline: whether such a binary starts on the database.
func CheckSchemaPreBaseline(ctx context.Context, db *bmdb.DB) error {
	ext, err := preBaseline()
	if err != nil {
		return err
	}
	return checkSchema(ctx, db, ext)
}
