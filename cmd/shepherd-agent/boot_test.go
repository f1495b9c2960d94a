package main

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// recordedBoot reads the boot identity of the machine's last recorded
// heartbeat (uuid.Nil: none).
func (f *fleet) recordedBoot() uuid.UUID {
	f.t.Helper()
	var boot *uuid.UUID
	err := f.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		boot = nil
		return tx.QueryRow(ctx, `SELECT boot_id FROM machine_agent_heartbeat WHERE machine_id = $1`, f.machine).Scan(&boot)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	if boot == nil {
		return uuid.Nil
	}
	return *boot
}

// runForeground runs the agent in the foreground with extra flags, records
// it, waits for its heartbeats and stops it, returning its log.
func runForegroundAgent(t *testing.T, bin string, f *fleet, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"-foreground", "-key_file", filepath.Join(dir, "key"), "-pid_file", filepath.Join(dir, "agent.pid"), "-log_file", ""}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdin = bytes.NewReader(f.initLine())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		t.Fatalf("no answer: %v; stderr:\n%s", err, stderr.String())
	}
	since := time.Now()
	f.recordAgent(line)
	f.waitHeartbeats(since)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
	}
	return stderr.String()
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
	if got := f.recordedBoot(); got != boot {
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
	if got := f.recordedBoot(); got != uuid.Nil {
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
