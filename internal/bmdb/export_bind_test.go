package bmdb

// BoundToLoss counts the contexts waiting for the session's loss (Bind,
// Lease.Bind) that were not released, for session_test.go.
func (s *Session) BoundToLoss() int {
	s.onLoss.mu.Lock()
	defer s.onLoss.mu.Unlock()
	return len(s.onLoss.m)
}
