// Package pgcluster starts and stops a private PostgreSQL cluster from the
// server binaries installed on the machine (initdb and pg_ctl).
//
// Shepherd needs a real PostgreSQL in two places: the test harness
// (internal/bmdbtest), which must exercise the BMDB's constraints and locking
// against the real server rather than a mock, and the daemon's demo mode,
// which lets one command show the whole system working without an operator
// first provisioning a database. Both use this package so that there is a
// single, tested way of finding the binaries, dropping root privileges and
// reporting why a server did not come up.
//
// The cluster only listens on 127.0.0.1. By default it trusts every local
// connection (initdb -A trust), which is right for a throwaway test server
// but lets any user of the machine in as superuser; Options.Password makes
// every connection log in with a random password instead, for a server that
// runs on a shared host for longer (the demo).
package pgcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/freeport"
)

// ErrBinariesNotFound is returned by Start (wrapped) when neither PATH nor
// /usr/lib/postgresql/*/bin holds initdb and pg_ctl. Its text names the
// package to install, because the usual reader is someone running the tests
// or the demo on a fresh machine.
var ErrBinariesNotFound = errors.New(`PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin: install them with "apt-get install -y postgresql"`)

// debianBinGlob is where Debian and Ubuntu install the server binaries, one
// directory per major version, none of them on PATH. A variable so that tests
// can point it elsewhere.
var debianBinGlob = "/usr/lib/postgresql/*/bin"

// superuser is the cluster's bootstrap superuser (initdb -U). Fixed, so that
// DSNs are predictable whichever OS user runs the server.
const superuser = "postgres"

// systemUser is the unprivileged OS account the server runs as when we are
// root, because PostgreSQL refuses to run as root. The postgresql package
// creates it.
const systemUser = "postgres"

// maxSocketDirLen bounds the directory of the Unix socket: the socket path
// (dir + "/.s.PGSQL.NNNNN") must fit into sockaddr_un's 108 bytes, or the
// server refuses to start.
const maxSocketDirLen = 90

// Options configures Start.
type Options struct {
	// Dir holds everything of the cluster: the data directory (Dir/data), the
	// server log (Dir/postgres.log) and the Unix socket. If Dir/data already
	// holds a cluster it is reused, so that the daemon's demo mode keeps its
	// state between runs. Required. When running as root, ownership of Dir is
	// handed to the postgres system user.
	Dir string
	// Port is the TCP port on 127.0.0.1. Zero picks a free port.
	Port int
	// Fast trades durability for speed (fsync, synchronous_commit and
	// full_page_writes off, initdb --no-sync). Right for tests, whose data is
	// thrown away; wrong for anything that should survive a machine crash.
	Fast bool
	// Settings are more server settings, each "name=value" as postgres -c
	// takes it, applied after the defaults (so that they override them): a
	// benchmark's way to run the server as a deployment would, e.g.
	// "shared_buffers=2GB".
	Settings []string
	// Logf, if set, receives progress messages (binaries found, initdb,
	// start, stop). Tests pass t.Logf, the daemon its logger.
	Logf func(format string, args ...any)
	// Password makes the server refuse every connection, TCP or Unix
	// socket, that does not log in with the superuser's password (SCRAM):
	// without it, any user of the machine connects as superuser and, through
	// COPY ... TO PROGRAM, runs commands as the server's OS user. Start sets
	// a new random password on every start, before the server listens, and
	// DSN carries it; a cluster created without Password (pg_hba.conf with
	// trust) is converted on its first start with it.
	Password bool
	// TemporarySearch, when running as root, lets the postgres user search
	// the ancestors of Dir only while a PostgreSQL command (initdb, pg_ctl)
	// runs, restoring their modes after it, instead of adding o+x to them
	// for good: the operator's directories (root's home, say) stay as they
	// were. The running server needs no path through them (it works in its
	// data directory and is reached over TCP), except to reload its
	// configuration files, which it then cannot.
	TemporarySearch bool
}

// Cluster is a running (or stopped) private PostgreSQL server started by
// Start. Its methods are safe for concurrent use.
type Cluster struct {
	// Dir is Options.Dir: the directory holding the data directory, the log
	// and the socket.
	Dir string
	// DataDir is the PostgreSQL data directory (PGDATA), Dir/data.
	DataDir string
	// LogFile is the server log, Dir/postgres.log.
	LogFile string
	// Port is the TCP port the server listens on at 127.0.0.1.
	Port int
	// BinDir is the directory initdb and pg_ctl were taken from.
	BinDir string

	fast      bool
	settings  []string
	logf      func(format string, args ...any)
	runAs     *runAs // nil when we are not root
	socketDir string // "" disables the Unix socket
	// password is the superuser's password, "" when the server trusts
	// every connection (Options.Password unset).
	password        string
	temporarySearch bool

	mu sync.Mutex
}

// runAs says how to run a command as the unprivileged system user.
type runAs struct {
	uid, gid int
	name     string
	runuser  string // path of runuser, or "" to use su
	su       string
}

// Start starts a private PostgreSQL cluster in opts.Dir, creating it with
// initdb first unless one exists there already. It returns once the server
// accepts connections. On failure the error carries the tail of the server
// log, which is where PostgreSQL says why it did not come up.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("pgcluster: Options.Dir is required")
	}
	for _, setting := range opts.Settings {
		if err := CheckSetting(setting); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: resolving %q: %w", opts.Dir, err)
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	binDir, err := findBinDir(exec.LookPath, debianBinGlob)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{
		Dir:      dir,
		DataDir:  filepath.Join(dir, "data"),
		LogFile:  filepath.Join(dir, "postgres.log"),
		BinDir:   binDir,
		fast:     opts.Fast,
		settings: slices.Clone(opts.Settings),
		logf:     logf,

		temporarySearch: opts.TemporarySearch,
	}
	if len(dir) <= maxSocketDirLen {
		c.socketDir = dir
	} else {
		logf("pgcluster: %s is too long for a Unix socket path; listening on TCP only", dir)
	}
	logf("pgcluster: using PostgreSQL binaries in %s", binDir)

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: creating %s: %w", dir, err)
	}
	if os.Geteuid() == 0 {
		ra, err := lookupRunAs()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		c.runAs = ra
		if err := c.handOver(); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()

	if err := c.initdbIfNeeded(ctx); err != nil {
		return nil, err
	}
	if err := c.stopLeftover(ctx); err != nil {
		return nil, err
	}
	if opts.Password {
		if err := c.requirePassword(ctx); err != nil {
			return nil, err
		}
	}

	port := opts.Port
	for attempt := 0; ; attempt++ {
		if opts.Port == 0 {
			if port, err = freeport.Pick(); err != nil {
				return nil, fmt.Errorf("pgcluster: picking a free port: %w", err)
			}
		}
		c.Port = port
		err = c.start(ctx)
		if err == nil {
			break
		}
		// freePort cannot reserve the port: someone else may bind it between
		// our probe and the server's bind. One retry on a new port makes that
		// race harmless in practice.
		if opts.Port == 0 && attempt == 0 && errors.Is(err, errAddrInUse) {
			logf("pgcluster: port %d was taken, retrying on another port", port)
			continue
		}
		return nil, err
	}
	logf("pgcluster: PostgreSQL running in %s on 127.0.0.1:%d", c.DataDir, c.Port)
	return c, nil
}

// DSN returns a URL connecting to database dbname of the cluster as the
// superuser, over TCP, without TLS (the server has none). With
// Options.Password it holds the password: treat it as a secret.
func (c *Cluster) DSN(dbname string) string {
	userinfo := url.User(superuser)
	if c.password != "" {
		userinfo = url.UserPassword(superuser, c.password)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     userinfo,
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port)),
		Path:     "/" + dbname,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Stop shuts the server down: fast mode (disconnect clients, roll back open
// transactions, checkpoint), falling back to immediate mode (no checkpoint,
// crash recovery on next start) if that fails. Stopping a stopped cluster is
// not an error, so Stop is safe in cleanups.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	running, err := c.running(ctx)
	if err != nil {
		return err
	}
	if !running {
		return nil
	}
	return c.stop(ctx)
}

// Restart restarts the server with pg_ctl restart -m mode ("smart", "fast" or
// "immediate") on the same port and options. Fault tests use it to cut every
// connection, or with "immediate" to simulate a crash.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	switch mode {
	case "smart", "fast", "immediate":
	default:
		return fmt.Errorf("pgcluster: unknown shutdown mode %q (want smart, fast or immediate)", mode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.logf("pgcluster: restarting (%s)", mode)
	offset := c.logSize()
	out, err := c.pgctl(ctx, "restart", "-w", "-m", mode, "-D", c.DataDir, "-l", c.LogFile, "-o", c.serverOptions())
	if err != nil {
		return c.startError("pg_ctl restart", out, offset, err)
	}
	return nil
}

// CreateDatabase creates database name, copied from template unless template
// is empty (then PostgreSQL's default, template1). Both names are quoted as
// identifiers, so any string is safe to pass.
func (c *Cluster) CreateDatabase(ctx context.Context, name, template string) error {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: connecting to create database %q: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgcluster: creating database %q: %w", name, err)
	}
	return nil
}

// findBinDir returns the directory holding initdb and pg_ctl: the one on PATH
// if both are there, else the newest major version under glob.
func findBinDir(lookPath func(string) (string, error), glob string) (string, error) {
	initdb, err1 := lookPath("initdb")
	pgctl, err2 := lookPath("pg_ctl")
	if err1 == nil && err2 == nil {
		// Symlinks on PATH (/usr/local/bin/pg_ctl -> .../15/bin/pg_ctl) are
		// resolved: pg_ctl runs the postgres binary next to its real self,
		// and initdb must come from that same installation or the data
		// directory may not match the server.
		initdb, err1 = filepath.EvalSymlinks(initdb)
		pgctl, err2 = filepath.EvalSymlinks(pgctl)
		if err1 == nil && err2 == nil && filepath.Dir(initdb) == filepath.Dir(pgctl) {
			return filepath.Dir(pgctl), nil
		}
	}
	dirs, err := filepath.Glob(glob)
	if err != nil {
		return "", fmt.Errorf("searching %s: %w", glob, err)
	}
	type candidate struct {
		dir     string
		version []int
	}
	var cands []candidate
	for _, d := range dirs {
		if !isExecutable(filepath.Join(d, "initdb")) || !isExecutable(filepath.Join(d, "pg_ctl")) {
			continue
		}
		// /usr/lib/postgresql/<version>/bin
		cands = append(cands, candidate{dir: d, version: parseVersion(filepath.Base(filepath.Dir(d)))})
	}
	if len(cands) == 0 {
		return "", ErrBinariesNotFound
	}
	sort.Slice(cands, func(i, j int) bool { return versionLess(cands[j].version, cands[i].version) })
	return cands[0].dir, nil
}

// parseVersion turns "15" or "9.6" into its numeric components, so that 10
// sorts after 9.6. Non-numeric components count as 0.
func parseVersion(s string) []int {
	var v []int
	for _, p := range strings.Split(s, ".") {
		n, _ := strconv.Atoi(p)
		v = append(v, n)
	}
	return v
}

func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// lookupRunAs finds the postgres system user and a way to switch to it.
func lookupRunAs() (*runAs, error) {
	u, err := user.Lookup(systemUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root, but there is no %q system user to run it as: create it (useradd --system --user-group %s) or install the postgresql package: %w", systemUser, systemUser, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("user %s has non-numeric uid %q: %w", systemUser, u.Uid, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("user %s has non-numeric gid %q: %w", systemUser, u.Gid, err)
	}
	ra := &runAs{uid: uid, gid: gid, name: u.Username}
	if p, err := exec.LookPath("runuser"); err == nil {
		ra.runuser = p
	} else if p, err := exec.LookPath("su"); err == nil {
		ra.su = p
	} else {
		return nil, errors.New("running as root, but neither runuser nor su is available to drop to the postgres user: install util-linux")
	}
	return ra, nil
}

// handOver gives Dir to the postgres user and makes sure that user can reach
// it: PostgreSQL runs as postgres and must read and write everything in Dir,
// and every ancestor must be searchable by it (with TemporarySearch, only
// while a command runs: see run).
func (c *Cluster) handOver() error {
	err := filepath.WalkDir(c.Dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, c.runAs.uid, c.runAs.gid)
	})
	if err != nil {
		return fmt.Errorf("handing %s over to user %s: %w", c.Dir, c.runAs.name, err)
	}
	if c.temporarySearch {
		return nil
	}
	_, err = c.makeSearchable()
	return err
}

// widened is an ancestor of Dir that makeSearchable gave o+x, with its mode
// before.
type widened struct {
	path string
	mode fs.FileMode
}

// makeSearchable gives o+x, and only that (a listing stays private), to each
// ancestor of Dir that the postgres user cannot search (such as a 0700
// directory from os.MkdirTemp, or root's home), and returns those it
// changed. On error, it has restored what it changed.
func (c *Cluster) makeSearchable() ([]widened, error) {
	var changed []widened
	for p := filepath.Dir(c.Dir); ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			c.restoreModes(changed)
			return nil, fmt.Errorf("checking %s: %w", p, err)
		}
		searchable := st.Mode().Perm()&0o001 != 0
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			switch {
			case int(sys.Uid) == c.runAs.uid:
				searchable = st.Mode().Perm()&0o100 != 0
			case int(sys.Gid) == c.runAs.gid:
				searchable = st.Mode().Perm()&0o010 != 0
			}
		}
		if !searchable {
			if !c.temporarySearch {
				c.logf("pgcluster: making %s searchable (o+x) so that user %s can reach %s", p, c.runAs.name, c.Dir)
			}
			if err := os.Chmod(p, chmodBits(st.Mode())|0o001); err != nil {
				c.restoreModes(changed)
				return nil, fmt.Errorf("making %s searchable for user %s: %w", p, c.runAs.name, err)
			}
			changed = append(changed, widened{path: p, mode: chmodBits(st.Mode())})
		}
		if p == filepath.Dir(p) {
			return changed, nil
		}
	}
}

// chmodBits is the part of mode that os.Chmod sets: the permissions and the
// setuid, setgid and sticky bits, which a chmod of the permissions alone
// would clear (a setgid directory would stop passing on its group).
func chmodBits(mode fs.FileMode) fs.FileMode {
	return mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

// restoreModes undoes makeSearchable, innermost directory first. It only
// clears the o+x it added, so that another change to a mode made
// meanwhile stays.
func (c *Cluster) restoreModes(changed []widened) {
	for _, w := range changed {
		st, err := os.Stat(w.path)
		if err == nil {
			err = os.Chmod(w.path, chmodBits(st.Mode())&^0o001|w.mode&0o001)
		}
		if err != nil {
			c.logf("pgcluster: restoring the mode of %s: %v", w.path, err)
		}
	}
}

// initdbIfNeeded creates the cluster unless DataDir already holds one.
func (c *Cluster) initdbIfNeeded(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(c.DataDir, "PG_VERSION")); err == nil {
		c.logf("pgcluster: reusing the cluster in %s", c.DataDir)
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pgcluster: checking for a cluster in %s: %w", c.DataDir, err)
	}
	c.logf("pgcluster: creating a cluster in %s", c.DataDir)
	// --no-locale: the C locale exists everywhere (a missing locale named by
	// LANG would make initdb fail) and sorts by bytes, so behaviour does not
	// depend on the machine.
	args := []string{"-D", c.DataDir, "-A", "trust", "-U", superuser, "-E", "UTF8", "--no-locale"}
	if c.fast {
		args = append(args, "--no-sync")
	}
	out, err := c.run(ctx, filepath.Join(c.BinDir, "initdb"), args...)
	if err != nil {
		return fmt.Errorf("pgcluster: initdb in %s: %w\n%s", c.DataDir, err, out)
	}
	return nil
}

// hbaConf is pg_hba.conf with Options.Password: the superuser's password
// (SCRAM) for every connection. No line trusts, not even the Unix socket's
// (in Dir, 0700): root would still pass, as the server's user would.
const hbaConf = `# Written by shepherd's pgcluster (Options.Password), over what initdb wrote:
# every connection must log in with a password, so that no other user of
# this machine can connect. Rewritten on every start.
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
`

// requirePassword makes the stopped cluster require a password: it writes
// pg_hba.conf and sets a new random password for the superuser in
// single-user mode, so that no server ever listens meanwhile with the
// trust that initdb (or an older cluster) left. Callers hold c.mu.
func (c *Cluster) requirePassword(ctx context.Context) error {
	hba := filepath.Join(c.DataDir, "pg_hba.conf")
	// Rewritten in place: the file keeps its owner, the server's user.
	f, err := os.OpenFile(hba, os.O_WRONLY|os.O_TRUNC, 0)
	if err == nil {
		_, err = f.WriteString(hbaConf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("pgcluster: writing %s: %w", hba, err)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("pgcluster: generating a password: %w", err)
	}
	password := hex.EncodeToString(b)
	// One statement a line; hex needs no quoting. The password goes through
	// stdin, never a command line others could see in ps.
	sql := "SET password_encryption = 'scram-sha-256'\nALTER ROLE " + superuser + " PASSWORD '" + password + "'\n"
	out, err := c.runInput(ctx, strings.NewReader(sql), filepath.Join(c.BinDir, "postgres"), "--single", "-D", c.DataDir, "postgres")
	if err == nil && bytes.Contains(out, []byte("ERROR:")) {
		err = errors.New("the statement failed")
	}
	if err != nil {
		out = bytes.ReplaceAll(out, []byte(password), []byte("***"))
		return fmt.Errorf("pgcluster: setting the superuser's password in %s: %w\n%s", c.DataDir, err, bytes.TrimSpace(out))
	}
	c.password = password
	c.logf("pgcluster: the server in %s requires a password (a new one, set in single-user mode)", c.DataDir)
	return nil
}

// stopLeftover stops a server still running on DataDir, left behind by a
// previous run that was killed before it could stop it. Its port and
// options may differ from ours, so it cannot simply be adopted.
func (c *Cluster) stopLeftover(ctx context.Context) error {
	running, err := c.running(ctx)
	if err != nil || !running {
		return err
	}
	c.logf("pgcluster: stopping a server left running in %s by a previous run", c.DataDir)
	return c.stop(ctx)
}

// errAddrInUse marks a start that failed because the port was taken.
var errAddrInUse = errors.New("address already in use")

// start runs pg_ctl start on c.Port. Callers hold c.mu.
func (c *Cluster) start(ctx context.Context) error {
	offset := c.logSize()
	out, err := c.pgctl(ctx, "start", "-w", "-D", c.DataDir, "-l", c.LogFile, "-o", c.serverOptions())
	if err != nil {
		return c.startError("pg_ctl start", out, offset, err)
	}
	return nil
}

// CheckSetting reports whether setting has the form of Options.Settings,
// name=value, so that a command can refuse a bad one before it starts
// anything.
func CheckSetting(setting string) error {
	if name, _, ok := strings.Cut(setting, "="); !ok || name == "" {
		return fmt.Errorf("server setting %q is not name=value", setting)
	}
	return nil
}

// serverOptions is the postgres command line passed through pg_ctl -o. pg_ctl
// hands it to /bin/sh, hence the quoting of the socket directory.
func (c *Cluster) serverOptions() string {
	opts := []string{
		"-p", strconv.Itoa(c.Port),
		"-c", "listen_addresses=127.0.0.1",
		"-k", shellQuote(c.socketDir),
		// Tests run many packages in parallel, each with many pools.
		"-c", "max_connections=300",
	}
	if c.fast {
		opts = append(opts,
			"-c", "fsync=off",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
		)
	}
	for _, setting := range c.settings {
		opts = append(opts, "-c", shellQuote(setting))
	}
	return strings.Join(opts, " ")
}

// startError builds the error of a failed start or restart: pg_ctl's output
// and the part of the server log written since offset, which is where the
// server says why it stopped. It wraps errAddrInUse when the port was taken.
func (c *Cluster) startError(what string, out []byte, offset int64, err error) error {
	tail := c.logTail(offset)
	if bytes.Contains(tail, []byte("Address already in use")) || bytes.Contains(tail, []byte("could not create any TCP/IP sockets")) {
		err = fmt.Errorf("%w: %w", errAddrInUse, err)
	}
	return fmt.Errorf("pgcluster: %s on 127.0.0.1:%d in %s: %w\npg_ctl output:\n%s\nserver log (%s):\n%s",
		what, c.Port, c.DataDir, err, strings.TrimSpace(string(out)), c.LogFile, strings.TrimSpace(string(tail)))
}

// stop runs pg_ctl stop -m fast, then -m immediate if that fails. Callers
// hold c.mu.
func (c *Cluster) stop(ctx context.Context) error {
	c.logf("pgcluster: stopping the server in %s", c.DataDir)
	out, err := c.pgctl(ctx, "stop", "-w", "-m", "fast", "-D", c.DataDir)
	if err == nil {
		return nil
	}
	c.logf("pgcluster: fast shutdown failed (%v: %s), trying immediate", err, bytes.TrimSpace(out))
	out2, err2 := c.pgctl(ctx, "stop", "-w", "-m", "immediate", "-D", c.DataDir)
	if err2 != nil {
		return fmt.Errorf("pgcluster: stopping the server in %s: fast: %w (%s); immediate: %w (%s)",
			c.DataDir, err, bytes.TrimSpace(out), err2, bytes.TrimSpace(out2))
	}
	return nil
}

// running reports whether a server runs on DataDir, using pg_ctl status,
// whose exit status 3 means "not running".
func (c *Cluster) running(ctx context.Context) (bool, error) {
	out, err := c.pgctl(ctx, "status", "-D", c.DataDir)
	if err == nil {
		return true, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 3 {
		return false, nil
	}
	return false, fmt.Errorf("pgcluster: pg_ctl status in %s: %w (%s)", c.DataDir, err, bytes.TrimSpace(out))
}

func (c *Cluster) pgctl(ctx context.Context, args ...string) ([]byte, error) {
	return c.run(ctx, filepath.Join(c.BinDir, "pg_ctl"), args...)
}

// run runs a PostgreSQL binary, as the postgres user when we are root, and
// returns its combined output. The environment loses every PG* variable (a
// PGPORT or PGDATA of the caller must not redirect our commands) and gets the
// C locale, so that messages we look for are in English.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return c.runInput(ctx, nil, name, args...)
}

// runInput is run with stdin read from input (nil: none). With
// TemporarySearch, the postgres user may search Dir's ancestors only while
// the command runs.
func (c *Cluster) runInput(ctx context.Context, input io.Reader, name string, args ...string) ([]byte, error) {
	if c.runAs != nil && c.temporarySearch {
		changed, err := c.makeSearchable()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		defer c.restoreModes(changed)
	}
	var cmd *exec.Cmd
	switch {
	case c.runAs == nil:
		cmd = exec.CommandContext(ctx, name, args...)
	case c.runAs.runuser != "":
		cmd = exec.CommandContext(ctx, c.runAs.runuser, append([]string{"-u", c.runAs.name, "--", name}, args...)...)
	default:
		quoted := []string{"exec", shellQuote(name)}
		for _, a := range args {
			quoted = append(quoted, shellQuote(a))
		}
		cmd = exec.CommandContext(ctx, c.runAs.su, c.runAs.name, "-s", "/bin/sh", "-c", strings.Join(quoted, " "))
	}
	// The postgres user may not be able to enter our working directory.
	cmd.Dir = c.Dir
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "LC_ALL=C", "LANG=C")
	var out bytes.Buffer
	cmd.Stdin = input
	cmd.Stdout = &out
	cmd.Stderr = &out
	// pg_ctl start sends the server's output to the log file, so nothing
	// should keep our pipes open after pg_ctl exits; if a child ever does,
	// don't hang on it.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

// logSize returns the current size of the server log, so that an error can
// show only what the latest start wrote.
func (c *Cluster) logSize() int64 {
	st, err := os.Stat(c.LogFile)
	if err != nil {
		return 0
	}
	return st.Size()
}

// logTail returns up to the last 4 KiB of the server log written after
// offset.
func (c *Cluster) logTail(offset int64) []byte {
	const maxTail = 4 << 10
	f, err := os.Open(c.LogFile)
	if err != nil {
		return []byte(fmt.Sprintf("(cannot read server log: %v)", err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return []byte(fmt.Sprintf("(cannot read server log: %v)", err))
	}
	if st.Size() < offset {
		offset = 0 // log was truncated or replaced
	}
	if st.Size()-offset > maxTail {
		offset = st.Size() - maxTail
	}
	b, err := io.ReadAll(io.NewSectionReader(f, offset, st.Size()-offset))
	if err != nil {
		return []byte(fmt.Sprintf("(cannot read server log: %v)", err))
	}
	return b
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// ServerPID returns the pid of the PostgreSQL server running on dataDir, if
// any. It checks that the process named by postmaster.pid is a postgres
// server on that directory, so that a caller never signals a recycled pid.
func ServerPID(dataDir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !strings.Contains(string(cmdline), "postgres") || !strings.Contains(string(cmdline), dataDir) {
		return 0, false
	}
	return pid, true
}
