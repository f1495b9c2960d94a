package shepherdcli

import (
	"flag"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// minHistoryRetention is the shortest -history_retention accepted. History
// is the audit trail that proves no machine was leased twice; a retention
// of minutes would delete the Started events of leases still running and
// leave nothing to audit a failure with.
const minHistoryRetention = time.Hour

// retentionFlags are the daemon's history retention settings. Every replica
// prunes; bmdb.PruneHistory makes them take turns.
type retentionFlags struct {
	retention time.Duration
	every     time.Duration
}

func (r *retentionFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&r.retention, "history_retention", bmdb.DefaultHistoryRetention,
		"how long work_history keeps events; older ones are deleted in small batches, by one replica at a time (0: keep them forever); never shorter than the longest per-machine budget window of any replica plus 5m, since budgets are counted from history")
	fs.DurationVar(&r.every, "history_prune_interval", time.Hour,
		"how often each replica looks for work_history events past -history_retention")
}

// check validates the flags; its errors name the flag.
func (r *retentionFlags) check() error {
	switch {
	case r.retention < 0:
		return usagef("-history_retention %s: must not be negative (0 keeps history forever)", r.retention)
	case r.retention > 0 && r.retention < minHistoryRetention:
		return usagef("-history_retention %s: must be at least %s (or 0 to keep history forever): history is the audit trail of running work", r.retention, minHistoryRetention)
	case r.every <= 0:
		return usagef("-history_prune_interval %s: must be positive", r.every)
	}
	return nil
}
