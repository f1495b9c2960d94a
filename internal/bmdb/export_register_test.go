package bmdb

import "context"

// EnsureRegistered registers p with c through the DB of s unless that DB
// did already (as a runner does at start), for the tests that claim.
func EnsureRegistered(ctx context.Context, s *Session, p Process, c Candidates) error {
	return s.db.ensureRegistered(ctx, p, c, "test")
}
