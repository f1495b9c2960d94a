// Package sshdtest runs a real OpenSSH server for tests: Debian's
// openssh-server (/usr/sbin/sshd), started by the test in the foreground on
// 127.0.0.1 on a free port, with a host key and a client key of its own and
// its own sshd_config, so that SSH code is tested against the server it will
// meet on machines, not a Go imitation of it.
//
// A missing sshd fails the test with a message naming the package to
// install; it never skips, since a skipped SSH test protects nothing.
//
// The server logs in the user running the test (root in CI), with public
// key authentication only. Tests as root need /run/sshd, OpenSSH's privilege
// separation directory, which Start creates when it is missing.
package sshdtest

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/shepherd-fleet/shepherd/internal/freeport"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
	"github.com/shepherd-fleet/shepherd/internal/proctest"
)

// SSHD is where Debian's openssh-server installs the server.
const SSHD = "/usr/sbin/sshd"

// Server is a running sshd.
type Server struct {
	// Addr is host:port, on 127.0.0.1.
	Addr string
	// Port is Addr's port.
	Port int
	// User is the login user: the one running the test.
	User string
	// ClientKeyFile is an unencrypted private key (OpenSSH format) that the
	// server accepts for User.
	ClientKeyFile string
	// ClientSigner is the same key, parsed.
	ClientSigner ssh.Signer
	// Dir is the server's private directory (config, keys, log). Tests may
	// put files for the remote side there: it is on the same machine.
	Dir string

	t testing.TB

	mu      sync.Mutex
	hostKey ssh.PublicKey
	cmd     *exec.Cmd
	exited  chan struct{}
	log     *syncBuffer
}

// Start starts sshd; it is stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := os.Stat(SSHD); err != nil {
		t.Fatalf("sshdtest: %s not found (%v): install Debian's openssh-server package (apt-get install -y openssh-server); .ci/run installs it when missing", SSHD, err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatalf("sshdtest: who am I: %v", err)
	}
	if os.Geteuid() == 0 {
		// sshd refuses to start as root without its privilege separation
		// directory, which the package's service unit creates at boot.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatalf("sshdtest: creating /run/sshd: %v", err)
		}
	}
	dir := t.TempDir()
	s := &Server{User: u.Username, Dir: dir, t: t, log: &syncBuffer{}}

	// Client key and its authorization.
	_, clientPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s.ClientKeyFile = filepath.Join(dir, "client_ed25519")
	writePrivateKey(t, s.ClientKeyFile, clientPriv)
	if s.ClientSigner, err = ssh.NewSignerFromKey(clientPriv); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(s.ClientSigner.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	s.newHostKey(t)

	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freeport.Pick()
		if err != nil {
			t.Fatalf("sshdtest: finding a free port: %v", err)
		}
		s.Port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.start(); lastErr == nil {
			break
		}
		// Another process may have taken the port in between: try another.
	}
	if lastErr != nil {
		t.Fatalf("sshdtest: %v", lastErr)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("sshd log:\n%s", s.Log())
		}
	})
	return s
}

// HostKey returns the public host key the server presents now.
func (s *Server) HostKey() ssh.PublicKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostKey
}

// KnownHostsFile writes a known_hosts file holding the server's current
// host key for its address and returns its path.
func (s *Server) KnownHostsFile(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "known_hosts")
	line := fmt.Sprintf("[127.0.0.1]:%d %s", s.Port, ssh.MarshalAuthorizedKey(s.HostKey()))
	if err := os.WriteFile(p, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Log returns what sshd logged (-e: to stderr).
func (s *Server) Log() string { return s.log.String() }

// Stop stops the server (established sessions go on until they end).
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	proctest.Stop(cmd.Process, exited, 10*time.Second)
}

// Restart stops the server and starts it again on the same port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		t.Fatalf("sshdtest: restarting: %v", err)
	}
}

// RotateHostKey gives the server a new host key and restarts it, which is
// what a reinstalled machine (or an impostor) looks like to a client.
func (s *Server) RotateHostKey(t testing.TB) {
	t.Helper()
	s.Stop()
	s.newHostKey(t)
	if err := s.start(); err != nil {
		t.Fatalf("sshdtest: restarting with a new host key: %v", err)
	}
}

func (s *Server) newHostKey(t testing.TB) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	writePrivateKey(t, filepath.Join(s.Dir, "host_ed25519"), priv)
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.hostKey = sshPub
	s.mu.Unlock()
}

// WriteNewKey writes a fresh ed25519 private key, unencrypted and in
// OpenSSH format, to path (mode 0600): a key file for a configuration
// under test, or a client key that the server does not accept.
func WriteNewKey(t testing.TB, path string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	writePrivateKey(t, path, priv)
}

func writePrivateKey(t testing.TB, path string, key ed25519.PrivateKey) {
	t.Helper()
	block, err := ssh.MarshalPrivateKey(key, "sshdtest")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
}

// config is the server's sshd_config: everything it needs is in Dir, and
// only public key logins of the test's user are accepted.
func (s *Server) config() string {
	return strings.Join([]string{
		"Port " + strconv.Itoa(s.Port),
		"ListenAddress 127.0.0.1",
		"HostKey " + filepath.Join(s.Dir, "host_ed25519"),
		"PidFile " + filepath.Join(s.Dir, "sshd.pid"),
		"AuthorizedKeysFile " + filepath.Join(s.Dir, "authorized_keys"),
		"AllowUsers " + s.User,
		"StrictModes no",
		"UsePAM no",
		"PubkeyAuthentication yes",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PermitRootLogin prohibit-password",
		"Subsystem sftp internal-sftp",
		"MaxStartups 100",
		"MaxSessions 100",
		"LogLevel VERBOSE",
		"",
	}, "\n")
}

// start runs sshd on s.Port and waits until it answers with an SSH banner.
func (s *Server) start() error {
	cfgFile := filepath.Join(s.Dir, "sshd_config")
	if err := os.WriteFile(cfgFile, []byte(s.config()), 0o600); err != nil {
		return err
	}
	// Check the configuration first: its errors are clearer than a server
	// that exits.
	if out, err := exec.Command(SSHD, "-t", "-f", cfgFile).CombinedOutput(); err != nil {
		return fmt.Errorf("%s -t rejects the test configuration: %v: %s", SSHD, err, out)
	}
	s.log.WriteString(fmt.Sprintf("--- sshdtest: starting sshd on %s\n", s.Addr))
	cmd := exec.Command(SSHD, "-D", "-e", "-f", cfgFile)
	cmd.Stdout = s.log
	cmd.Stderr = s.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", SSHD, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("sshd exited at start: %s", lastLines(s.Log(), 10))
		default:
		}
		if err := banner(s.Addr); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("sshd did not answer on %s within 15s (%v): %s", s.Addr, err, lastLines(s.Log(), 10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// banner checks that addr answers with an SSH identification string.
func banner(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "SSH-2.0-") {
		return fmt.Errorf("unexpected banner %q", line)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// KillProcessesUnder kills (SIGKILL) every process whose executable lies
// under dir, and returns their pids: the agents a test started, which
// detach from their SSH session and would otherwise outlive it.
func KillProcessesUnder(dir string) []int {
	var killed []int
	for _, pid := range ProcessesUnder(dir) {
		if pid != os.Getpid() && syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
	}
	return killed
}

// ProcessesUnder returns the pids of the processes whose executable lies
// under dir.
func ProcessesUnder(dir string) []int {
	dir = filepath.Clean(dir) + string(filepath.Separator)
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err == nil && strings.HasPrefix(strings.TrimSuffix(exe, " (deleted)"), dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// syncBuffer is a bytes.Buffer safe for concurrent writers and readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) WriteString(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.WriteString(s)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// BuildAgent builds cmd/shepherd-agent, the real agent, into a directory of
// t's and returns the binary's path.
func BuildAgent(t testing.TB) string {
	t.Helper()
	return BuildCommand(t, "github.com/shepherd-fleet/shepherd/cmd/shepherd-agent")
}

// BuildCommand builds the main package pkg (an import path of this module)
// into a directory of t's and returns the binary's path.
func BuildCommand(t testing.TB, pkg string) string {
	t.Helper()
	out, err := gobuild.Build(t.TempDir(), pkg, []string{"CGO_ENABLED=0"})
	if err != nil {
		t.Fatalf("sshdtest: %v", err)
	}
	return out
}
