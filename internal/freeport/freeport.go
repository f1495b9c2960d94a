// Package freeport picks TCP ports for servers that tests start as separate
// processes (PostgreSQL, sshd, Prometheus, a replica), which must be told a
// port rather than hand back a listener.
package freeport

import (
	"fmt"
	"net"
	"testing"
)

// Pick returns a TCP port on 127.0.0.1 that was free a moment ago. Another
// process may take it before the caller's server binds it; callers that
// start servers retry on a bind failure where that matters.
func Pick() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("picking a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// For is Pick for a test, which fails when no port can be had.
func For(t testing.TB) int {
	t.Helper()
	port, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	return port
}
