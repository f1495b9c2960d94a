//go:build !linux

package bmdb

import "syscall"

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not available: the
// keepalives alone notice a dead peer.
func setUserTimeout(string, string, syscall.RawConn) error { return nil }
