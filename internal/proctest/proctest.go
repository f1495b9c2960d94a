// Package proctest finds and stops the programs that tests run as child
// processes (sshd, Patroni, PgBouncer, Prometheus, ipmi_sim), the one way
// every suite does it.
package proctest

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Need returns the path of program, looked up on PATH and in /usr/sbin and
// /usr/bin (where Debian puts daemons that PATH may lack), and fails t,
// naming the Debian package to install, if it is not installed: a test
// never skips for lack of a program, since a skipped check protects
// nothing.
func Need(t testing.TB, program, debianPackage string) string {
	t.Helper()
	for _, p := range []string{program, "/usr/sbin/" + program, "/usr/bin/" + program} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatalf("%s is not installed: install the Debian package %s (apt-get install -y %s; .ci/run does)", program, debianPackage, debianPackage)
	return ""
}

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
