package bmdb

// Exported for retention_test.go, which replays one pruning batch by hand
// and holds it open, to show what a batch does and does not block.
const (
	RetentionLockKey     = retentionLockKey
	RetentionTryLockSQL  = qRetentionTryLock
	HistoryPruneBatchSQL = qHistoryPruneBatch
)
