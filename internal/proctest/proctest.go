// Package proctest stops the child processes that tests start (sshd,
// PostgreSQL's helpers, Patroni, Prometheus), the one way every suite
// does it.
package proctest

import (
	"os"
	"syscall"
	"time"
)

// Stop asks p to stop with SIGTERM and waits until exited is closed (by
// the goroutine that waited for p); if that takes longer than grace, it
// kills p (SIGKILL) and waits for it to be gone.
func Stop(p *os.Process, exited <-chan struct{}, grace time.Duration) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = p.Kill()
		<-exited
	}
}
