package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

// buildAgent builds the real agent binary.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin, err := gobuild.Build(t.TempDir(), "github.com/shepherd-fleet/shepherd/cmd/shepherd-agent", nil)
	if err != nil {
		t.Fatalf("building the agent: %v", err)
	}
	return bin
}

// fleet is a BMDB with one provided machine and a heartbeat endpoint over
// TLS, as Shepherd runs them.
type fleet struct {
	t       *testing.T
	db      *bmdb.DB
	machine uuid.UUID
	init    agentproto.Init
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	machine := bmdbtest.AddMachines(t, db, 1)[0]
	srv := httptest.NewTLSServer(heartbeat.New(db, heartbeat.Options{}).Handler())
	t.Cleanup(srv.Close)
	return &fleet{t: t, db: db, machine: machine, init: agentproto.Init{
		MachineID:         machine,
		HeartbeatURL:      srv.URL + heartbeat.Path,
		CACertPEM:         string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})),
		HeartbeatInterval: 200 * time.Millisecond,
	}}
}

// recordAgent does what AgentStart does with an answer: check it and record
// the key.
func (f *fleet) recordAgent(answerLine []byte) agentproto.Answer {
	f.t.Helper()
	a, err := agentproto.DecodeAnswer(answerLine)
	if err != nil {
		f.t.Fatalf("answer %q: %v", answerLine, err)
	}
	if err := a.CheckEcho(f.init); err != nil {
		f.t.Fatal(err)
	}
	err = f.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, f.machine, a.PublicKey)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return a
}

func (f *fleet) lastHeartbeat() time.Time {
	f.t.Helper()
	return bmdbtest.LastHeartbeat(f.t, f.db, f.machine)
}

// waitHeartbeats waits until the machine has a heartbeat newer than after,
// twice (so that the agent is seen heartbeating, not just once).
func (f *fleet) waitHeartbeats(after time.Time) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for range 2 {
		for {
			at := f.lastHeartbeat()
			if at.After(after) {
				after = at
				break
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("no heartbeat after %s", after)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (f *fleet) initLine() []byte {
	f.t.Helper()
	b, err := agentproto.EncodeInit(f.init)
	if err != nil {
		f.t.Fatal(err)
	}
	return append(b, '\n')
}

// alive reports whether pid runs (a zombie, which a container without an
// init may leave behind, does not).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name.
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file holds %q", b)
	}
	return pid
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); alive(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still runs", pid)
		}
	}
}

func TestForeground(t *testing.T) {
	bin := buildAgent(t)
	f := newFleet(t)
	dir := t.TempDir()
	keyFile, pidFile := filepath.Join(dir, "state", "key"), filepath.Join(dir, "agent.pid")
	a, line := startForegroundAgent(t, bin, f, "-key_file", keyFile, "-pid_file", pidFile, "-log_file", "")
	// Heartbeats sent before Shepherd records the key are refused; the agent
	// keeps going.
	time.Sleep(300 * time.Millisecond)
	if !f.lastHeartbeat().IsZero() {
		t.Fatal("heartbeat recorded before the agent's key was")
	}
	f.recordAgent(line)
	f.waitHeartbeats(time.Time{})

	st, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %#o, want 0600", st.Mode().Perm())
	}
	if pid := readPID(t, pidFile); pid != a.cmd.Process.Pid {
		t.Errorf("pid file holds %d, agent is %d", pid, a.cmd.Process.Pid)
	}

	log := a.stop(t)
	if b, _ := os.ReadFile(pidFile); len(b) != 0 {
		t.Errorf("pid file holds %q after a clean exit", b)
	}
	t.Logf("agent log:\n%s", log)
	for _, want := range []string{"heartbeat failed (1 in a row)", "unknown_machine", "heartbeat accepted again", "stopping"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if strings.Contains(log, "PRIVATE KEY") {
		t.Error("the log shows the private key")
	}
}

// startDetached runs the agent as AgentStart does: init on stdin, answer on
// stdout, and the command must end while the agent keeps running.
func startDetached(t *testing.T, bin string, f *fleet, dir string) (answer []byte, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"-key_file", filepath.Join(dir, "key"), "-pid_file", filepath.Join(dir, "agent.pid"), "-log_file", filepath.Join(dir, "agent.log"))
	cmd.Stdin = bytes.NewReader(f.initLine())
	var out, errOut bytes.Buffer
	// Buffers, not files: exec copies through pipes and Wait returns only
	// when every holder of the pipes has closed them, as an SSH session
	// would. A daemon that kept stdout or stderr would hang this.
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("agent: %v; stderr:\n%s", err, errOut.String())
	}
	t.Logf("agent answered and detached in %s", time.Since(start))
	lines := bytes.Split(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n"))
	if len(lines) != 1 {
		t.Fatalf("stdout is not one line: %q", out.String())
	}
	return lines[0], errOut.String()
}

func TestDetached(t *testing.T) {
	bin := buildAgent(t)
	f := newFleet(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "agent.pid")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if log, err := os.ReadFile(filepath.Join(dir, "agent.log")); err == nil {
			t.Logf("agent log:\n%s", log)
		}
	})

	line, _ := startDetached(t, bin, f, dir)
	first := f.recordAgent(line)
	pid := readPID(t, pidFile)
	if !alive(pid) {
		t.Fatalf("background agent %d does not run", pid)
	}
	f.waitHeartbeats(time.Time{})
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("background agent's session is %d, want its own (%d)", sid, pid)
	}

	// AgentStart runs it again (say, after a failed attempt): the new agent
	// keeps the key and replaces the running one.
	line, _ = startDetached(t, bin, f, dir)
	second := f.recordAgent(line)
	if !second.PublicKey.Equal(first.PublicKey) {
		t.Error("the restarted agent has a new key")
	}
	waitGone(t, pid)
	newPID := readPID(t, pidFile)
	if newPID == pid || !alive(newPID) {
		t.Fatalf("pid file holds %d (old %d), alive %v", newPID, pid, alive(newPID))
	}
	f.waitHeartbeats(f.lastHeartbeat())

	// Killed (as the end-to-end test does to trigger Recovery), it stops
	// heartbeating.
	if err := syscall.Kill(newPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, newPID)
	time.Sleep(300 * time.Millisecond)
	last := f.lastHeartbeat()
	time.Sleep(600 * time.Millisecond)
	if got := f.lastHeartbeat(); !got.Equal(last) {
		t.Errorf("heartbeats continue after the agent was killed: %s then %s", last, got)
	}
}

func TestRefusals(t *testing.T) {
	bin := buildAgent(t)
	f := newFleet(t)
	dir := t.TempDir()
	run := func(stdin string, args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
	}
	keyFile := filepath.Join(dir, "key")
	flags := []string{"-key_file", keyFile, "-pid_file", filepath.Join(dir, "pid"), "-log_file", filepath.Join(dir, "log")}

	for name, stdin := range map[string]string{
		"empty":         "",
		"not json":      "hello\n",
		"unknown field": strings.Replace(string(f.initLine()), `{`, `{"x":1,`, 1),
		"version 2":     strings.Replace(string(f.initLine()), `"version":1`, `"version":2`, 1),
	} {
		code, out, errOut := run(stdin, flags...)
		if code != 1 || out != "" || !strings.Contains(errOut, "init message") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", name, code, out, errOut)
		}
	}
	if _, err := os.Stat(keyFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused init created the key file: %v", err)
	}

	if err := os.WriteFile(keyFile, []byte("not a key"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(string(f.initLine()), flags...)
	if code != 1 || out != "" || !strings.Contains(errOut, "0600") {
		t.Errorf("world-readable key: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if err := os.Chmod(keyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(string(f.initLine()), flags...)
	if code != 1 || out != "" || !strings.Contains(errOut, "PRIVATE KEY") {
		t.Errorf("garbage key: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := run("", "-bogus"); code != 2 {
		t.Errorf("unknown flag: exit %d, stderr %q", code, errOut)
	}
}
