package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// foregroundAgent is an agent run with -foreground, as a test watches it.
type foregroundAgent struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
}

// startForegroundAgent starts the agent with -foreground and args, sends
// it f's init line and returns it with its answer line; it is killed when
// the test ends if still running.
func startForegroundAgent(t *testing.T, bin string, f *fleet, args ...string) (*foregroundAgent, []byte) {
	t.Helper()
	a := &foregroundAgent{cmd: exec.Command(bin, append([]string{"-foreground"}, args...)...)}
	a.cmd.Stdin = bytes.NewReader(f.initLine())
	a.cmd.Stderr = &a.stderr
	stdout, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Kill(); _ = a.cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		t.Fatalf("no answer: %v; stderr:\n%s", err, a.stderr.String())
	}
	return a, line
}

// stop stops the agent with SIGTERM, fails t unless it exits cleanly, and
// returns its log.
func (a *foregroundAgent) stop(t *testing.T) string {
	t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v; stderr:\n%s", err, a.stderr.String())
	}
	return a.stderr.String()
}

// runForegroundAgent runs the agent in the foreground with extra flags,
// records it, waits for its heartbeats and stops it, returning its log.
func runForegroundAgent(t *testing.T, bin string, f *fleet, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	a, line := startForegroundAgent(t, bin, f, append([]string{"-key_file", filepath.Join(dir, "key"), "-pid_file", filepath.Join(dir, "agent.pid"), "-log_file", ""}, extra...)...)
	since := time.Now()
	f.recordAgent(line)
	f.waitHeartbeats(since)
	return a.stop(t)
}

// The agent's heartbeats carry the boot identity it reads (version 2), and
// its log names the boot and its build digest. An agent that cannot read a
// boot identity still heartbeats, with version 1, and says what that
// costs.
func TestBootIdentity(t *testing.T) {
	bin := buildAgent(t)
	f := newFleet(t)
	boot := uuid.New()
	bootFile := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(bootFile, []byte(boot.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := runForegroundAgent(t, bin, f, "-boot_id_file", bootFile)
	if got := bmdbtest.BootOf(t, f.db, f.machine); got != boot {
		t.Errorf("recorded boot %s, want %s; log:\n%s", got, boot, log)
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("boot %s, build sha256 %x", boot, sha256.Sum256(exe)); !strings.Contains(log, want) {
		t.Errorf("log lacks %q:\n%s", want, log)
	}

	log = runForegroundAgent(t, bin, f, "-boot_id_file", filepath.Join(t.TempDir(), "missing"))
	if got := bmdbtest.BootOf(t, f.db, f.machine); got != uuid.Nil {
		t.Errorf("recorded boot %s from an agent without one", got)
	}
	if !strings.Contains(log, "heartbeats of protocol version 1") {
		t.Errorf("log does not say the heartbeats are of version 1:\n%s", log)
	}
}

// On Linux, the default is the kernel's boot identity.
func TestDefaultBootIDFile(t *testing.T) {
	if _, err := os.Stat(defaultBootIDFile); err != nil {
		t.Skipf("no %s: %v", defaultBootIDFile, err)
	}
	if _, err := readBootID(defaultBootIDFile); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "not a uuid", "00000000-0000-0000-0000-000000000000", strings.Repeat("x", 500)} {
		p := filepath.Join(t.TempDir(), "boot_id")
		if err := os.WriteFile(p, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readBootID(p); err == nil {
			t.Errorf("boot identity %q accepted", bad)
		}
	}
}
