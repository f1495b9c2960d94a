package bmdbtest

import (
	"os"
	"strconv"
	"testing"
)

// SyncMachines is how many machines the tests of removing a fleet's worth
// of machines in one sync list (providers' TestSyncRemovesManyMachines
// and the binary's TestStaticRemovesManyMachines): 2001, or
// SHEPHERD_SYNC_MACHINES to time a real fleet's worth (10001).
func SyncMachines(t testing.TB) int {
	t.Helper()
	n := 2001
	if s := os.Getenv("SHEPHERD_SYNC_MACHINES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 2 {
			t.Fatalf("SHEPHERD_SYNC_MACHINES=%q: want a count of at least 2", s)
		}
		n = v
	}
	return n
}
