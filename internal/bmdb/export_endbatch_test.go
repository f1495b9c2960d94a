package bmdb

// PendingEnds is how many lease ends of s wait for the next shared
// transaction, for endbatch_test.go to wait on.
func PendingEnds(s *Session) int {
	s.ends.mu.Lock()
	defer s.ends.mu.Unlock()
	return len(s.ends.pending)
}
