package bmdb

// SetDueBuildChunk makes due-row builds through db cover n machines per
// transaction, so that a test's small fleet takes several.
func (db *DB) SetDueBuildChunk(n int) { db.dueBuildChunk = n }
