package bmdb

import (
	"io/fs"
	"strconv"
	"strings"

	"github.com/shepherd-fleet/shepherd/migrations"
)

// LatestVersion is the newest schema version this binary knows: that of
// the newest of Shepherd's migrations it embeds. Sessions record it with
// their conditions (RecordCandidates); the migrate package checks a
// database against it.
func LatestVersion() uint { return LatestIn(migrations.FS) }

// LatestIn is the newest version among the migrations (NNNN_name.up.sql)
// at the root of fsys, 0 when there is none.
func LatestIn(fsys fs.FS) uint {
	var latest uint
	entries, _ := fs.ReadDir(fsys, ".")
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		if !ok || !strings.HasSuffix(e.Name(), ".up.sql") {
			continue
		}
		if v, err := strconv.ParseUint(prefix, 10, 32); err == nil && uint(v) > latest {
			latest = uint(v)
		}
	}
	return latest
}
