package shepherdcli

import (
	"flag"
	"time"

	"github.com/shepherd-fleet/shepherd/daemon"
)

// minHistoryRetention is the shortest -history_retention accepted: the
// daemon's (daemon.MinHistoryRetention says why).
const minHistoryRetention = daemon.MinHistoryRetention

// retentionFlags are the daemon's history retention settings. Every replica
// prunes; bmdb.PruneHistory makes them take turns.
type retentionFlags struct {
	retention time.Duration
	every     time.Duration
}

func (r *retentionFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&r.retention, "history_retention", daemon.DefaultHistoryRetention,
		"how long work_history keeps events; older ones are deleted in small batches, by one replica at a time (0: keep them forever); never shorter than the longest per-machine budget window of any replica plus 5m, since budgets are counted from history")
	fs.DurationVar(&r.every, "history_prune_interval", daemon.DefaultHistoryPruneInterval,
		"how often each replica looks for work_history events past -history_retention")
}

// daemonRetention is -history_retention as daemon.Options takes it: the
// flag's 0 (forever) is daemon.KeepHistoryForever, since the Options'
// zero is the default retention.
func (r *retentionFlags) daemonRetention() time.Duration {
	if r.retention == 0 {
		return daemon.KeepHistoryForever
	}
	return r.retention
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
