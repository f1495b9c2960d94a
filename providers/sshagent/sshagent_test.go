package sshagent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

// heartbeatSink counts the heartbeats agents send it.
type heartbeatSink struct {
	URL   string
	count atomic.Int64
}

func startHeartbeatSink(t *testing.T) *heartbeatSink {
	s := &heartbeatSink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.count.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL + "/heartbeat"
	return s
}

type fixture struct {
	sshd   *sshdtest.Server
	db     *bmdb.DB
	cfg    Config
	remote string // the agent's directory on the "machine"
	target Target
	sink   *heartbeatSink
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{sshd: sshdtest.Start(t), sink: startHeartbeatSink(t)}
	var err error
	f.db = bmdbtest.NewDB(t, bmdb.Options{})
	f.remote = filepath.Join(t.TempDir(), "remote")
	t.Cleanup(func() { sshdtest.KillProcessesUnder(f.remote) })
	f.cfg = DefaultConfig()
	f.cfg.KeyFile = f.sshd.ClientKeyFile
	// A placeholder: the tests that run the real agent build it.
	f.cfg.AgentBinary = filepath.Join(t.TempDir(), "placeholder")
	if err := os.WriteFile(f.cfg.AgentBinary, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.cfg.RemotePath = filepath.Join(f.remote, "shepherd-agent")
	f.cfg.HeartbeatURL = f.sink.URL
	f.cfg.HeartbeatInterval = 200 * time.Millisecond
	f.cfg.ConnectTimeout = 20 * time.Second
	f.cfg.ExecTimeout = 40 * time.Second
	if err := f.cfg.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	// The machine must exist for its host key to be pinned.
	err = f.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		id, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: "m1", Address: f.sshd.Addr})
		f.target = Target{Machine: id, Name: "test/m1", Address: f.sshd.Addr, User: f.sshd.User}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) client(t *testing.T) *Client {
	t.Helper()
	c, err := New(f.cfg, BMDBPins{DB: f.db.Public()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func (f *fixture) pinned(t *testing.T) string {
	t.Helper()
	key, _, err := BMDBPins{DB: f.db.Public()}.Pinned(context.Background(), f.target.Machine)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// agentPID reads the running agent's pid file.
func (f *fixture) agentPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.remote, "agent.pid"))
	if err != nil {
		t.Fatalf("reading the agent's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("agent pid file holds %q", b)
	}
	return pid
}

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestStartAgentTrustOnFirstUse(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.cfg.AgentBinary = sshdtest.BuildAgent(t)
	c := f.client(t)
	start := time.Now()
	key, err := c.StartAgent(withTimeout(t, time.Minute), f.target)
	if err != nil {
		t.Fatalf("StartAgent: %v\nsshd log:\n%s", err, f.sshd.Log())
	}
	t.Logf("first StartAgent took %s", time.Since(start))
	if len(key) != ed25519.PublicKeySize {
		t.Fatalf("key is %d bytes, want %d", len(key), ed25519.PublicKeySize)
	}
	if got, want := f.pinned(t), formatKey(f.sshd.HostKey()); got != want {
		t.Fatalf("pinned key %q, want the server's %q", got, want)
	}
	if st, err := os.Stat(f.cfg.RemotePath); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("uploaded agent: %v, %v", st, err)
	}
	// The agent detached and heartbeats.
	pid := f.agentPID(t)
	deadline := time.Now().Add(20 * time.Second)
	for f.sink.count.Load() == 0 {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(f.remote, "agent.log"))
			t.Fatalf("no heartbeat from agent %d within 20s; its log:\n%s", pid, log)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Starting again reuses the agent's key and replaces the running agent.
	key2, err := c.StartAgent(withTimeout(t, time.Minute), f.target)
	if err != nil {
		t.Fatalf("second StartAgent: %v", err)
	}
	if !bytes.Equal(key, key2) {
		t.Error("the agent's key changed between starts")
	}
	if pid2 := f.agentPID(t); pid2 == pid {
		t.Errorf("the second start left agent %d in place", pid)
	}
	if pids := sshdtest.ProcessesUnder(f.remote); len(pids) != 1 {
		t.Errorf("agents running: %v, want exactly one", pids)
	}
}

func TestChangedHostKeyIsRefusedWithLongBackoff(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.cfg.AgentBinary = sshdtest.BuildAgent(t)
	c := f.client(t)
	if _, err := c.StartAgent(withTimeout(t, time.Minute), f.target); err != nil {
		t.Fatalf("StartAgent: %v", err)
	}
	old := f.pinned(t)
	agentsBefore := sshdtest.ProcessesUnder(f.remote)

	f.sshd.RotateHostKey(t)
	_, err := c.StartAgent(withTimeout(t, time.Minute), f.target)
	if !errors.Is(err, ErrHostKeyChanged) || !strings.Contains(err.Error(), "SSH host key changed") {
		t.Fatalf("StartAgent after a host key change: %v, want ErrHostKeyChanged", err)
	}
	var be *backoff.Error
	if !errors.As(err, &be) || be.Backoff != HostKeyBackoff {
		t.Fatalf("StartAgent after a host key change: %v carries no backoff.Error with HostKeyBackoff", err)
	}
	if !strings.Contains(err.Error(), ssh.FingerprintSHA256(f.sshd.HostKey())) {
		t.Errorf("the error does not name the new key's fingerprint: %v", err)
	}
	t.Logf("cause: %v", err)
	if f.pinned(t) != old {
		t.Fatal("the pinned key changed")
	}
	if now := sshdtest.ProcessesUnder(f.remote); len(now) != len(agentsBefore) || now[0] != agentsBefore[0] {
		t.Fatalf("agents changed after a refused connection: %v -> %v", agentsBefore, now)
	}
	if err := c.Reboot(withTimeout(t, time.Minute), f.target); !errors.Is(err, ErrHostKeyChanged) {
		t.Fatalf("Reboot after a host key change: %v", err)
	}

	// An operator forgets the pinned key: the next connection pins the new.
	err = f.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.DeleteSSHHostKey(ctx, f.target.Machine)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartAgent(withTimeout(t, time.Minute), f.target); err != nil {
		t.Fatalf("StartAgent after forgetting the key: %v", err)
	}
	if got := f.pinned(t); got != formatKey(f.sshd.HostKey()) {
		t.Fatalf("pinned %q, want the new key", got)
	}
}

func TestKnownHosts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.cfg.KnownHostsFile = f.sshd.KnownHostsFile(t)
	f.cfg.RebootCommand = "touch " + shellQuote(filepath.Join(f.sshd.Dir, "rebooted"))
	c, err := New(f.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Reboot(withTimeout(t, time.Minute), f.target); err != nil {
		t.Fatalf("Reboot with a matching known_hosts: %v", err)
	}
	if f.pinned(t) != "" {
		t.Error("a key was pinned although known_hosts is in use")
	}

	f.sshd.RotateHostKey(t)
	err = c.Reboot(withTimeout(t, time.Minute), f.target)
	var be *backoff.Error
	if !errors.Is(err, ErrHostKeyChanged) || !errors.As(err, &be) || !strings.Contains(err.Error(), "known_hosts has") {
		t.Fatalf("Reboot after a host key change: %v", err)
	}

	// Another address is unknown: refused before connecting.
	other := f.target
	other.Address = "127.0.0.2:" + strconv.Itoa(f.sshd.Port)
	err = c.Reboot(withTimeout(t, time.Minute), other)
	if !errors.Is(err, ErrHostKeyUnknown) || !errors.As(err, &be) {
		t.Fatalf("Reboot of an unknown host: %v", err)
	}
}

func TestReboot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	marker := filepath.Join(f.sshd.Dir, "rebooted")
	f.cfg.RebootCommand = "touch " + shellQuote(marker)
	c := f.client(t)
	if err := c.Reboot(withTimeout(t, time.Minute), f.target); err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the reboot command did not run: %v", err)
	}

	f.cfg.RebootCommand = "echo 'sudo: a password is required' >&2; exit 3"
	err := f.client(t).Reboot(withTimeout(t, time.Minute), f.target)
	if err == nil || !strings.Contains(err.Error(), "exited with status 3: sudo: a password is required") {
		t.Fatalf("Reboot with a failing command: %v", err)
	}

	// The machine going down under the command is a success.
	f.cfg.RebootCommand = "kill -9 $PPID"
	if err := f.client(t).Reboot(withTimeout(t, time.Minute), f.target); err != nil {
		t.Fatalf("Reboot whose connection drops: %v", err)
	}
}

func TestTimeoutsAndCancellation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.cfg.RebootCommand = "sleep 30"
	f.cfg.ExecTimeout = 500 * time.Millisecond
	c := f.client(t)
	start := time.Now()
	err := c.Reboot(withTimeout(t, time.Minute), f.target)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "running reboot command on "+f.sshd.Addr+": timed out after 500ms") {
		t.Fatalf("Reboot with a hanging command: %v", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("exec timeout of 500ms took %s", d)
	}

	// Cancellation stops a step at once.
	f.cfg.ExecTimeout = time.Minute
	c = f.client(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Second, cancel)
	start = time.Now()
	err = c.Reboot(ctx, f.target)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Reboot: %v", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("cancellation took %s", d)
	}

	// A server that accepts but never speaks SSH: the connect timeout.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	f.cfg.ConnectTimeout = 500 * time.Millisecond
	c = f.client(t)
	silent := f.target
	silent.Address = l.Addr().String()
	start = time.Now()
	err = c.Reboot(withTimeout(t, time.Minute), silent)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out after 500ms") {
		t.Fatalf("Reboot of a silent server: %v", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("connect timeout of 500ms took %s", d)
	}
}

func TestLoginRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.cfg.KeyFile = filepath.Join(t.TempDir(), "other_key")
	sshdtest.WriteNewKey(t, f.cfg.KeyFile)
	err := f.client(t).Reboot(withTimeout(t, time.Minute), f.target)
	var be *backoff.Error
	if err == nil || !strings.Contains(err.Error(), "unable to authenticate") || errors.As(err, &be) {
		t.Fatalf("Reboot with an unauthorized key: %v, want an authentication failure with the default backoff", err)
	}
}

// fakeAgent writes a shell script that answers every init with answer.
func fakeAgent(t *testing.T, answer string) string {
	p := filepath.Join(t.TempDir(), "fake-agent")
	script := "#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' " + shellQuote(answer) + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAnswerIsChecked(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	wrongInit := agentproto.Init{MachineID: uuid.New(), HeartbeatURL: f.cfg.HeartbeatURL, HeartbeatInterval: f.cfg.HeartbeatInterval}
	wrongEcho, err := agentproto.EncodeAnswer(agentproto.Answer{PublicKey: pub, Init: wrongInit})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, answer, want string
	}{
		{"wrong echo", string(wrongEcho), "answer echoes machine_id " + wrongInit.MachineID.String()},
		{"garbage", "Segmentation fault", `answered 19 bytes starting "Segmentation fault"`},
		{"newer protocol", `{"version": 99, "public_key": "x", "init": {}}`, "unsupported agent protocol version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.cfg.AgentBinary = fakeAgent(t, tc.answer)
			_, err := f.client(t).StartAgent(withTimeout(t, time.Minute), f.target)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("StartAgent: %v, want an error containing %q", err, tc.want)
			}
		})
	}

	// An agent that fails says why.
	p := filepath.Join(t.TempDir(), "failing-agent")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho 'shepherd-agent: -key_file: permission denied' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.cfg.AgentBinary = p
	_, err = f.client(t).StartAgent(withTimeout(t, time.Minute), f.target)
	if err == nil || !strings.Contains(err.Error(), "running agent on "+f.sshd.Addr+": exited with status 1: shepherd-agent: -key_file: permission denied") {
		t.Fatalf("StartAgent with a failing agent: %v", err)
	}
}

func TestConfigCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, _ := ssh.MarshalPrivateKey(priv, "")
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600)
	enc, _ := ssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte("pw"))
	encFile := filepath.Join(dir, "enc")
	os.WriteFile(encFile, pem.EncodeToMemory(enc), 0o600)
	agent := filepath.Join(dir, "agent")
	os.WriteFile(agent, []byte("x"), 0o755)
	openKey := filepath.Join(dir, "open-key")
	os.WriteFile(openKey, pem.EncodeToMemory(block), 0o600)
	os.Chmod(openKey, 0o644)
	good := func() Config {
		c := DefaultConfig()
		c.KeyFile, c.AgentBinary, c.HeartbeatURL = keyFile, agent, "https://shepherd.example:7443/heartbeat"
		return c
	}
	if c := good(); c.Check() != nil {
		t.Fatalf("good config: %v", c.Check())
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no key", func(c *Config) { c.KeyFile = "" }, "-ssh_key_file: required"},
		{"encrypted key", func(c *Config) { c.KeyFile = encFile }, "is encrypted"},
		{"key readable by others", func(c *Config) { c.KeyFile = openKey }, "accessible by others (mode 0644)"},
		{"missing agent", func(c *Config) { c.AgentBinary = filepath.Join(dir, "nope") }, "-agent_binary: stat"},
		{"no heartbeat URL", func(c *Config) { c.HeartbeatURL = "" }, "-agent_heartbeat_url: required"},
		{"bad heartbeat URL", func(c *Config) { c.HeartbeatURL = "ftp://x" }, "scheme must be https or http"},
		{"missing known_hosts", func(c *Config) { c.KnownHostsFile = filepath.Join(dir, "nope") }, "-ssh_known_hosts"},
		{"zero timeout", func(c *Config) { c.ExecTimeout = 0 }, "-agent_ssh_exec_timeout 0s: must be positive"},
		{"directory remote path", func(c *Config) { c.RemotePath = "/opt/" }, "-agent_remote_path"},
	} {
		c := good()
		tc.edit(&c)
		if err := c.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Check() = %v, want %q", tc.name, err, tc.want)
		}
	}
}
