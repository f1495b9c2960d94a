package daemon

import (
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// TestMain provides the tests' PostgreSQL (bmdbtest). The binary's tests,
// flags, signals and exit statuses, are package shepherdcli's.
func TestMain(m *testing.M) { bmdbtest.Main(m) }
