// Package ipmisimtest runs a real IPMI 2.0 BMC for tests: OpenIPMI's
// ipmi_sim (Debian openipmi), speaking RMCP+ on UDP 127.0.0.1, with one
// admin user and a fake chassis whose power state and action log are files,
// so that a test sees on the BMC's side that a power cycle happened.
// ipmi-sim.sh (beside this file) starts and stops it.
//
// A missing ipmi_sim or ipmitool fails the test with the packages to
// install; it never skips.
package ipmisimtest

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/proctest"
)

//go:embed ipmi-sim.sh
var script []byte

// Sim is a running ipmi_sim.
type Sim struct {
	Host, User, Password string
	Port                 int
	PID                  int
	dir, scriptPath      string
}

// Start starts a simulator that is stopped when the test ends.
func Start(t testing.TB) *Sim {
	t.Helper()
	// IPMI tests run against a real ipmi_sim, driven with ipmitool.
	proctest.Need(t, "ipmi_sim", "openipmi")
	proctest.Need(t, "ipmitool", "ipmitool")
	dir := t.TempDir()
	s := &Sim{dir: filepath.Join(dir, "sim"), scriptPath: filepath.Join(dir, "ipmi-sim.sh")}
	if err := os.WriteFile(s.scriptPath, script, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", s.scriptPath, s.dir).CombinedOutput()
	if err != nil {
		t.Fatalf("starting ipmi_sim: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("bash", s.scriptPath, "stop", s.dir).Run() })
	for _, line := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "IPMI_HOST":
			s.Host = v
		case "IPMI_PORT":
			s.Port, _ = strconv.Atoi(v)
		case "IPMI_PID":
			s.PID, _ = strconv.Atoi(v)
		case "IPMI_USER":
			s.User = v
		case "IPMI_PASS":
			s.Password = v
		}
	}
	if s.Port == 0 || s.PID == 0 {
		t.Fatalf("ipmi-sim.sh printed no port or pid:\n%s", out)
	}
	return s
}

// WriteCredentials writes the simulator's account (password pass, or the
// right one when pass is "") to a 0600 file in dir and returns its path.
func (s *Sim) WriteCredentials(t testing.TB, dir, pass string) string {
	t.Helper()
	if pass == "" {
		pass = s.Password
	}
	p := filepath.Join(dir, "ipmi-"+strconv.Itoa(s.Port)+".creds")
	if err := os.WriteFile(p, []byte(s.User+":"+pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// PowerOns is how many times the chassis went from off to on: what a
// power cycle adds one to (about a second after it was asked for).
func (s *Sim) PowerOns(t testing.TB) int {
	t.Helper()
	n, _ := strconv.Atoi(strings.TrimSpace(s.chassisFile(t, "power_ons")))
	return n
}

// Log is the chassis's action log, a line per action ("<ms> power 0").
func (s *Sim) Log(t testing.TB) string {
	t.Helper()
	return s.chassisFile(t, "log")
}

// chassisFile reads a file the simulated chassis writes (ipmi-sim.sh).
func (s *Sim) chassisFile(t testing.TB, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(s.dir, "chassis", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// Freeze stops the simulator (SIGSTOP): requests go unanswered, as with a
// hung BMC. Thaw resumes it.
func (s *Sim) Freeze(t testing.TB) { t.Helper(); s.signal(t, syscall.SIGSTOP) }

// Thaw resumes a frozen simulator.
func (s *Sim) Thaw(t testing.TB) { t.Helper(); s.signal(t, syscall.SIGCONT) }

func (s *Sim) signal(t testing.TB, sig syscall.Signal) {
	if err := syscall.Kill(s.PID, sig); err != nil {
		t.Fatalf("signalling ipmi_sim: %v", err)
	}
}

// Kill kills the simulator (SIGKILL), as a BMC that dies mid-session.
func (s *Sim) Kill(t testing.TB) { t.Helper(); s.signal(t, syscall.SIGKILL) }

// SetPower writes what the simulated chassis reports as its power state,
// as a machine that tripped its PSU (off) or was switched on by hand: the
// BMC's log does not record it, so that the log holds only what a client
// asked for.
func (s *Sim) SetPower(t testing.TB, on bool) {
	t.Helper()
	v := "0\n"
	if on {
		v = "1\n"
	}
	if err := os.WriteFile(filepath.Join(s.dir, "chassis", "power"), []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
}
