// Package sshagent reaches machines over SSH (golang.org/x/crypto/ssh) for
// Shepherd's providers: it starts the Shepherd agent (upload over SFTP, run
// with the init message of agentproto on stdin, check the answer) and
// reboots machines that have no BMC.
//
// Host keys are always verified, never ignored: against an OpenSSH
// known_hosts file when one is configured, otherwise by trust on first use,
// pinning the first key a machine presents in the BMDB
// (machine_ssh_host_key) and refusing any other afterwards. A refused key
// fails with an error wrapping ErrHostKeyChanged (or ErrHostKeyUnknown) and
// carrying HostKeyBackoff as a backoff.Error, so that the machine
// is left alone long enough for an operator to look.
//
// Every step has its own bound (connect, upload, exec), and every step
// stops when its context is cancelled: the connection is closed under it.
package sshagent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/internal/secretfile"
)

// Target is one machine as SSH reaches it.
type Target struct {
	// Machine is the machine's BMDB id: the agent's machine_id, and the key
	// of its pinned host key.
	Machine uuid.UUID
	// Name names the machine in errors, e.g. "static/rack1-node01".
	Name string
	// Address is host:port.
	Address string
	// User is the login user.
	User string
}

// Client reaches machines over SSH. It is safe for concurrent use.
type Client struct {
	cfg      Config
	signer   ssh.Signer
	hostKeys *hostKeys
	init     agentproto.Init
}

// New returns a client for cfg, which must have passed Check. pins keeps
// the keys trusted on first use; it is unused (and may be nil) when
// cfg.KnownHostsFile is set.
func New(cfg Config, pins PinStore) (*Client, error) {
	signer, err := loadSigner(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("-ssh_key_file: %w", err)
	}
	if cfg.KnownHostsFile == "" && pins == nil {
		return nil, errors.New("sshagent: no known_hosts file and no pin store: host keys could not be verified")
	}
	init, err := cfg.initTemplate()
	if err != nil {
		return nil, err
	}
	return &Client{
		cfg:      cfg,
		signer:   signer,
		hostKeys: &hostKeys{knownHostsFile: cfg.KnownHostsFile, pins: pins},
		init:     init,
	}, nil
}

// maxKeyFile bounds a private key file: an RSA key of 16384 bits in PEM is
// under 13 KiB.
const maxKeyFile = 64 << 10

// loadSigner reads a private key file, refusing one that others may read
// (as OpenSSH does).
func loadSigner(file string) (ssh.Signer, error) {
	pem, err := secretfile.Read(file, maxKeyFile)
	if err != nil {
		return nil, fmt.Errorf("reading SSH key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(pem)
	var missing *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &missing):
		return nil, fmt.Errorf("SSH key %s is encrypted: Shepherd needs an unencrypted key file, readable only by its user", file)
	case err != nil:
		// The parser's message never quotes key material.
		return nil, fmt.Errorf("SSH key %s: %w", file, err)
	}
	return signer, nil
}

// PublicKey returns the client's public key, in authorized_keys format, for
// operators to install on machines.
func (c *Client) PublicKey() string { return formatKey(c.signer.PublicKey()) }

// conn is an SSH connection to one machine.
type conn struct {
	*ssh.Client
	target Target
	stop   func() bool
}

func (c *conn) close() {
	c.stop()
	c.Client.Close()
}

// dial connects to t and logs in, verifying its host key, within the
// connect timeout. The connection is closed when ctx is done.
func (c *Client) dial(ctx context.Context, t Target) (*conn, error) {
	check, err := c.hostKeys.prepare(ctx, t)
	if err != nil {
		return nil, hostKeyFailure(fmt.Errorf("connecting to %s: %w", t.Address, err))
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancel()
	var d net.Dialer
	tcp, err := d.DialContext(cctx, "tcp", t.Address)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", t.Address, stepError(ctx, cctx, err, c.cfg.ConnectTimeout))
	}
	// The handshake runs on the raw connection: closing it when the
	// connect step ends early is how it is bounded.
	stopHandshakeBound := context.AfterFunc(cctx, func() { tcp.Close() })
	sc, chans, reqs, err := ssh.NewClientConn(tcp, t.Address, &ssh.ClientConfig{
		User:              t.User,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(c.signer)},
		HostKeyCallback:   check.callback,
		HostKeyAlgorithms: check.algorithms,
		Timeout:           c.cfg.ConnectTimeout,
	})
	if !stopHandshakeBound() || err != nil {
		tcp.Close()
		if refused := check.refused(); refused != nil {
			return nil, hostKeyFailure(fmt.Errorf("connecting to %s: %w", t.Address, refused))
		}
		if err == nil {
			err = cctx.Err()
		}
		return nil, fmt.Errorf("SSH login to %s@%s: %w", t.User, t.Address, stepError(ctx, cctx, err, c.cfg.ConnectTimeout))
	}
	client := ssh.NewClient(sc, chans, reqs)
	return &conn{
		Client: client,
		target: t,
		stop:   context.AfterFunc(ctx, func() { client.Close() }),
	}, nil
}

// hostKeyFailure marks err, a host key refusal, for the longer backoff.
func hostKeyFailure(err error) error {
	if errors.Is(err, ErrHostKeyChanged) || errors.Is(err, ErrHostKeyUnknown) {
		return backoff.With(err, HostKeyBackoff)
	}
	return err
}

// step runs fn, closing the connection if it does not return within
// timeout (or when ctx is done), and names the step in the error.
func (c *conn) step(ctx context.Context, name string, timeout time.Duration, fn func() error) error {
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := context.AfterFunc(sctx, func() { c.Client.Close() })
	err := fn()
	// When the bound fired, it closed the connection under fn: whatever fn
	// returned (a dropped connection even looks like success to the reboot
	// command), the step timed out or was cancelled.
	if fired := !stop(); fired || err != nil {
		return fmt.Errorf("%s on %s: %w", name, c.target.Address, stepError(ctx, sctx, err, timeout))
	}
	return nil
}

// stepError explains an error that ended a step: the step's own bound
// (sctx, derived from parent) or the cancellation of parent, rather than
// the "use of closed network connection" that closing the connection
// caused.
func stepError(parent, sctx context.Context, err error, timeout time.Duration) error {
	switch {
	case parent.Err() != nil && err == nil:
		return context.Cause(parent)
	case parent.Err() != nil:
		return fmt.Errorf("%w (%w)", context.Cause(parent), err)
	case sctx.Err() != nil:
		return fmt.Errorf("timed out after %s: %w", timeout, context.DeadlineExceeded)
	}
	return err
}

// run runs cmd with stdin, returning what it wrote to stdout (at most
// maxStdout bytes are kept). A non-zero exit is an error that quotes the
// start of stderr.
func (c *conn) run(cmd string, stdin []byte, maxStdout int) ([]byte, error) {
	sess, err := c.NewSession()
	if err != nil {
		return nil, fmt.Errorf("opening SSH session: %w", err)
	}
	defer sess.Close()
	stdout := &capBuffer{max: maxStdout}
	stderr := &capBuffer{max: 4 << 10}
	sess.Stdin = bytes.NewReader(stdin)
	sess.Stdout = stdout
	sess.Stderr = stderr
	err = sess.Run(cmd)
	var exit *ssh.ExitError
	if errors.As(err, &exit) {
		return stdout.Bytes(), &commandError{status: exit.ExitStatus(), signal: exit.Signal(), stderr: printable(stderr.Bytes(), 512)}
	}
	if err != nil {
		return stdout.Bytes(), err
	}
	return stdout.Bytes(), nil
}

// commandError is a remote command's non-zero exit.
type commandError struct {
	status int
	signal string
	stderr string
}

func (e *commandError) Error() string {
	what := fmt.Sprintf("exited with status %d", e.status)
	if e.signal != "" {
		what = "killed by signal " + e.signal
	}
	if e.stderr != "" {
		return what + ": " + e.stderr
	}
	return what + " (no output on stderr)"
}

// upload copies the local file src to dst on the machine, atomically: it
// writes a temporary file next to dst and renames it over dst, so that a
// running agent's binary is never half-overwritten and an interrupted upload
// leaves no truncated agent behind.
func (c *conn) upload(src, dst string, mode os.FileMode) error {
	local, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("opening agent binary: %w", err)
	}
	defer local.Close()
	sc, err := sftp.NewClient(c.Client, sftp.UseConcurrentWrites(true))
	if err != nil {
		return fmt.Errorf("starting SFTP: %w", err)
	}
	defer sc.Close()
	if dir := path.Dir(dst); dir != "." && dir != "/" {
		if err := sc.MkdirAll(dir); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	tmp := dst + ".upload-" + hex.EncodeToString(suffix)
	f, err := sc.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL)
	if err != nil {
		return fmt.Errorf("creating %s: %w", tmp, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = sc.Remove(tmp)
		}
	}()
	if _, err := f.ReadFrom(local); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := sc.Chmod(tmp, mode); err != nil {
		return fmt.Errorf("making %s executable: %w", tmp, err)
	}
	if _, ok := sc.HasExtension("posix-rename@openssh.com"); ok {
		err = sc.PosixRename(tmp, dst)
	} else {
		// Plain SFTP rename refuses to replace a file.
		if rerr := sc.Remove(dst); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("replacing %s: %w", dst, rerr)
		}
		err = sc.Rename(tmp, dst)
	}
	if err != nil {
		return fmt.Errorf("renaming %s to %s: %w", tmp, dst, err)
	}
	committed = true
	return nil
}

// StartAgent uploads the agent to t, runs it with the init message for
// t.Machine, and returns the public key from its answer after checking that
// it echoes the init message.
func (c *Client) StartAgent(ctx context.Context, t Target) ([]byte, error) {
	init := c.init
	init.MachineID = t.Machine
	msg, err := agentproto.EncodeInit(init)
	if err != nil {
		return nil, fmt.Errorf("building init message: %w", err)
	}
	cn, err := c.dial(ctx, t)
	if err != nil {
		return nil, err
	}
	defer cn.close()
	if err := cn.step(ctx, "uploading agent", c.cfg.UploadTimeout, func() error {
		return cn.upload(c.cfg.AgentBinary, c.cfg.RemotePath, 0o755)
	}); err != nil {
		return nil, err
	}
	var out []byte
	if err := cn.step(ctx, "running agent", c.cfg.ExecTimeout, func() error {
		var err error
		out, err = cn.run(agentCommand(c.cfg.RemotePath), append(msg, '\n'), agentproto.MaxAnswerSize+2)
		return err
	}); err != nil {
		return nil, err
	}
	answer, err := agentproto.ReadAnswer(bytes.NewReader(out))
	if err != nil {
		return nil, fmt.Errorf("agent on %s answered %s: %w", t.Address, describeOutput(out), err)
	}
	if err := answer.CheckEcho(init); err != nil {
		return nil, fmt.Errorf("agent on %s: %w", t.Address, err)
	}
	return []byte(answer.PublicKey), nil
}

// Reboot runs the reboot command on t. A connection that drops before the
// command reports its exit status counts as success: that is what a reboot
// looks like from outside.
func (c *Client) Reboot(ctx context.Context, t Target) error {
	cn, err := c.dial(ctx, t)
	if err != nil {
		return err
	}
	defer cn.close()
	return cn.step(ctx, "running reboot command", c.cfg.ExecTimeout, func() error {
		_, err := cn.run(c.cfg.RebootCommand, nil, 4<<10)
		var missing *ssh.ExitMissingError
		if errors.As(err, &missing) || errors.Is(err, io.EOF) {
			return nil
		}
		return err
	})
}

// agentCommand is the shell command that starts the agent installed at
// remotePath, with its state (key, pid file, log) in the same directory.
func agentCommand(remotePath string) string {
	dir := path.Dir(remotePath)
	return strings.Join([]string{
		shellQuote(commandPath(remotePath)),
		shellQuote("-key_file=" + path.Join(dir, "agent.key")),
		shellQuote("-pid_file=" + path.Join(dir, "agent.pid")),
		shellQuote("-log_file=" + path.Join(dir, "agent.log")),
	}, " ")
}

// commandPath makes a relative path explicit, so that the shell runs the
// file rather than searching PATH for its name.
func commandPath(p string) string {
	if strings.Contains(p, "/") {
		return p
	}
	return "./" + p
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// describeOutput summarizes a remote command's stdout for an error.
func describeOutput(out []byte) string {
	if len(out) == 0 {
		return "nothing"
	}
	return fmt.Sprintf("%d bytes starting %q", len(out), printable(out, 80))
}

// printable returns at most n bytes of b with control characters (other
// than spaces) replaced, for quoting remote output in errors and history.
func printable(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	cut := len(b) > n
	if cut {
		b = b[:n]
	}
	s := strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(string(b), "?"))
	if cut {
		s += "..."
	}
	return s
}

// capBuffer keeps the first max bytes written to it and drops the rest,
// without ever failing a write (a failing writer would stall the remote
// command).
type capBuffer struct {
	buf bytes.Buffer
	max int
	n   int
}

func (b *capBuffer) Write(p []byte) (int, error) {
	b.n += len(p)
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (b *capBuffer) Bytes() []byte { return b.buf.Bytes() }
