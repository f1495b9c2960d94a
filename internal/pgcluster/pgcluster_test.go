package pgcluster

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// These tests need the real server binaries and fail, rather than skip, when
// they are missing: a skipped database test is a test that silently stopped
// protecting anything.

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startCluster starts a Fast cluster in a fresh directory and stops it when
// the test ends.
func startCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	ctx := testContext(t)
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	opts.Fast = true
	opts.Logf = t.Logf
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("Stop in cleanup: %v", err)
		}
	})
	return c
}

func connect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to %s: %v", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryInt(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestLifecycle(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	c := startCluster(t, Options{Dir: dir})

	if want := "postgres://postgres@127.0.0.1:"; !strings.HasPrefix(c.DSN("x"), want) {
		t.Errorf("DSN = %q, want prefix %q", c.DSN("x"), want)
	}
	conn := connect(t, ctx, c.DSN("postgres"))
	if n := queryInt(t, ctx, conn, "SELECT 1"); n != 1 {
		t.Fatalf("SELECT 1 = %d", n)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}

	// A template must have no connections while it is copied.
	if err := c.CreateDatabase(ctx, "src", ""); err != nil {
		t.Fatalf("CreateDatabase(src): %v", err)
	}
	src, err := pgx.Connect(ctx, c.DSN("src"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Exec(ctx, "CREATE TABLE copied (x int); INSERT INTO copied VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	src.Close(ctx)

	// A name that would break naive SQL or URL building.
	odd := `odd "name"; DROP/x?`
	if err := c.CreateDatabase(ctx, odd, "src"); err != nil {
		t.Fatalf("CreateDatabase(%q): %v", odd, err)
	}
	oddConn := connect(t, ctx, c.DSN(odd))
	var got string
	if err := oddConn.QueryRow(ctx, "SELECT current_database()").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != odd {
		t.Errorf("connected to %q, want %q", got, odd)
	}
	if n := queryInt(t, ctx, oddConn, "SELECT x FROM copied"); n != 7 {
		t.Errorf("copied.x in the copy of src = %d, want 7", n)
	}
	if err := c.CreateDatabase(ctx, odd, ""); err == nil {
		t.Error("creating an existing database succeeded")
	}

	for _, mode := range []string{"fast", "immediate"} {
		port := c.Port
		if err := c.Restart(ctx, mode); err != nil {
			t.Fatalf("Restart(%s): %v", mode, err)
		}
		if c.Port != port {
			t.Errorf("Restart(%s) moved the port from %d to %d", mode, port, c.Port)
		}
		if err := conn.Ping(ctx); err == nil {
			t.Errorf("a connection survived Restart(%s)", mode)
		}
		conn = connect(t, ctx, c.DSN("postgres"))
		if n := queryInt(t, ctx, conn, "SELECT x FROM kept"); n != 42 {
			t.Errorf("after Restart(%s): kept.x = %d, want 42", mode, n)
		}
	}
	if err := c.Restart(ctx, "gentle"); err == nil {
		t.Error("Restart with an unknown mode succeeded")
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if _, err := pgx.Connect(ctx, c.DSN("postgres")); err == nil {
		t.Error("connected to a stopped cluster")
	}

	// Starting again on the same directory reuses the cluster and its data,
	// as the daemon's demo mode does across runs.
	c2 := startCluster(t, Options{Dir: dir})
	conn2 := connect(t, ctx, c2.DSN("postgres"))
	if n := queryInt(t, ctx, conn2, "SELECT x FROM kept"); n != 42 {
		t.Errorf("after reuse: kept.x = %d, want 42", n)
	}
}

// A server still running on the data directory, left by a run that never
// called Stop, is replaced rather than making Start fail.
func TestStartStopsLeftover(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	c1 := startCluster(t, Options{Dir: dir})
	c2 := startCluster(t, Options{Dir: dir})
	connect(t, ctx, c2.DSN("postgres"))
	if c1.Port != c2.Port {
		if _, err := pgx.Connect(ctx, c1.DSN("postgres")); err == nil {
			t.Error("the leftover server still accepts connections")
		}
	}
}

// A start failure carries the server log, which says why.
func TestStartPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	c, err := Start(testContext(t), Options{Dir: t.TempDir(), Port: port, Fast: true, Logf: t.Logf})
	if err == nil {
		c.Stop(context.Background())
		t.Fatal("Start on a taken port succeeded")
	}
	t.Logf("Start on a taken port: %v", err)
	if !errors.Is(err, errAddrInUse) || !strings.Contains(err.Error(), "Address already in use") {
		t.Errorf("error does not show the server log's reason:\n%v", err)
	}
}

func TestStartNeedsDir(t *testing.T) {
	if _, err := Start(testContext(t), Options{}); err == nil {
		t.Error("Start without Dir succeeded")
	}
}

// Settings reach the server, after the defaults, through pg_ctl's shell
// (a value with a space and a quote arrives whole); a setting that is not
// name=value is refused before anything starts.
func TestStartSettings(t *testing.T) {
	ctx := testContext(t)
	c := startCluster(t, Options{Settings: []string{"shared_buffers=24MB", "max_connections=50", "application_name=it's a test"}})
	conn := connect(t, ctx, c.DSN("postgres"))
	for setting, want := range map[string]string{"shared_buffers": "24MB", "max_connections": "50", "application_name": "it's a test"} {
		var got string
		if err := conn.QueryRow(ctx, "SELECT setting FROM pg_settings WHERE name = $1 AND source = 'command line'", setting).Scan(&got); err != nil {
			t.Errorf("%s: %v", setting, err)
			continue
		}
		if setting == "shared_buffers" {
			// pg_settings counts it in 8 kB pages.
			want = "3072"
		}
		if got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	dir := t.TempDir()
	if _, err := Start(ctx, Options{Dir: dir, Settings: []string{"shared_buffers"}}); err == nil || !strings.Contains(err.Error(), `"shared_buffers" is not name=value`) {
		t.Errorf("Start with a setting that is not name=value: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("Start with a bad setting left %d entries in its directory", len(entries))
	}
}

func writeExecutable(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func notOnPath(string) (string, error) { return "", errors.New("not found") }

func TestFindBinDirNewestVersion(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"9.6", "10", "15", "16"} {
		writeExecutable(t, filepath.Join(root, v, "bin", "initdb"))
		if v != "16" { // incomplete installation: no pg_ctl
			writeExecutable(t, filepath.Join(root, v, "bin", "pg_ctl"))
		}
	}
	got, err := findBinDir(notOnPath, filepath.Join(root, "*", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "15", "bin"); got != want {
		t.Errorf("findBinDir = %s, want %s", got, want)
	}
}

func TestFindBinDirPrefersPath(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"15", "16"} {
		writeExecutable(t, filepath.Join(root, v, "bin", "initdb"))
		writeExecutable(t, filepath.Join(root, v, "bin", "pg_ctl"))
	}
	glob := filepath.Join(root, "*", "bin")

	pathDir := filepath.Join(root, "path")
	writeExecutable(t, filepath.Join(pathDir, "initdb"))
	writeExecutable(t, filepath.Join(pathDir, "pg_ctl"))
	onPath := func(name string) (string, error) { return filepath.Join(pathDir, name), nil }
	if got, err := findBinDir(onPath, glob); err != nil || got != pathDir {
		t.Errorf("findBinDir with binaries on PATH = %s, %v; want %s", got, err, pathDir)
	}

	// Symlinks on PATH, as in /usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin/pg_ctl.
	linkDir := filepath.Join(root, "links")
	if err := os.MkdirAll(linkDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "pg_ctl"} {
		if err := os.Symlink(filepath.Join(root, "15", "bin", name), filepath.Join(linkDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	onPath = func(name string) (string, error) { return filepath.Join(linkDir, name), nil }
	if got, err := findBinDir(onPath, glob); err != nil || got != filepath.Join(root, "15", "bin") {
		t.Errorf("findBinDir with symlinks on PATH = %s, %v; want %s", got, err, filepath.Join(root, "15", "bin"))
	}
}

func TestFindBinDirNotFound(t *testing.T) {
	_, err := findBinDir(notOnPath, filepath.Join(t.TempDir(), "*", "bin"))
	if !errors.Is(err, ErrBinariesNotFound) {
		t.Fatalf("findBinDir = %v, want ErrBinariesNotFound", err)
	}
	if !strings.Contains(err.Error(), `apt-get install -y postgresql`) {
		t.Errorf("error does not say what to install: %v", err)
	}
}

// refused reports whether connecting with dsn fails authentication.
func refused(ctx context.Context, dsn string) (bool, string) {
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		conn.Close(ctx)
		return false, "connected"
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "28P01", err.Error()
}

// With Password, only the DSN's password gets in: no password, a wrong one,
// and (as root) another OS user's psql over TCP and over the Unix socket
// are refused, and no pg_hba.conf line trusts. A cluster created without
// Password (trust) is closed by its first start with it, and every start
// sets a new password.
func TestPassword(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	trusting := startCluster(t, Options{Dir: dir})
	connect(t, ctx, trusting.DSN("postgres"))
	if err := trusting.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	c := startCluster(t, Options{Dir: dir, Password: true})
	conn := connect(t, ctx, c.DSN("postgres"))
	if n := queryInt(t, ctx, conn, "SELECT 1"); n != 1 {
		t.Fatalf("SELECT 1 = %d", n)
	}
	u, err := url.Parse(c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	if len(password) < 32 {
		t.Fatalf("the DSN's password %q is not a long random one", password)
	}
	for name, userinfo := range map[string]*url.Userinfo{
		"no password":    url.User("postgres"),
		"wrong password": url.UserPassword("postgres", "postgres"),
	} {
		v := *u
		v.User = userinfo
		if ok, msg := refused(ctx, v.String()); !ok {
			t.Errorf("%s: want refused (28P01), got %s", name, msg)
		}
	}
	hba, err := os.ReadFile(filepath.Join(c.DataDir, "pg_hba.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(hba), "\n") {
		if fields := strings.Fields(line); len(fields) > 0 && !strings.HasPrefix(fields[0], "#") && fields[len(fields)-1] != "scram-sha-256" {
			t.Errorf("pg_hba.conf line %q does not require a password", line)
		}
	}

	if os.Geteuid() == 0 {
		psql := filepath.Join(c.BinDir, "psql")
		for _, host := range []string{"127.0.0.1", c.Dir} {
			cmd := exec.CommandContext(ctx, "runuser", "-u", "nobody", "--", psql, "-w", "-h", host, "-p", strconv.Itoa(c.Port), "-U", "postgres", "-d", "postgres", "-c", "SELECT 1")
			cmd.Dir = "/"
			cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Errorf("user nobody connected through %s:\n%s", host, out)
			} else {
				t.Logf("user nobody through %s: %v: %s", host, err, strings.TrimSpace(string(out)))
			}
		}
	} else {
		t.Log("not root: another OS user's connection is not tried")
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	again := startCluster(t, Options{Dir: dir, Password: true})
	connect(t, ctx, again.DSN("postgres"))
	if ok, msg := refused(ctx, withPort(t, c.DSN("postgres"), again.Port)); !ok {
		t.Errorf("the previous start's password: want refused, got %s", msg)
	}
}

// withPort returns the URL dsn with its port replaced.
func withPort(t *testing.T, dsn string, port int) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(port))
	return u.String()
}

// As root with TemporarySearch, the ancestors of Dir keep their modes while
// the server runs and after it stops; without it, a 0700 ancestor gets o+x.
func TestTemporarySearch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the postgres user needs a way into Dir only when we run as root")
	}
	ctx := testContext(t)
	for _, temporary := range []bool{true, false} {
		parent := filepath.Join(t.TempDir(), "private")
		if err := os.Mkdir(parent, 0o700); err != nil {
			t.Fatal(err)
		}
		// A setgid directory keeps the bit through the change and back.
		if err := os.Chmod(parent, 0o700|os.ModeSetgid); err != nil {
			t.Fatal(err)
		}
		mode := func() os.FileMode {
			st, err := os.Stat(parent)
			if err != nil {
				t.Fatal(err)
			}
			return st.Mode() & (os.ModePerm | os.ModeSetgid)
		}
		c := startCluster(t, Options{Dir: filepath.Join(parent, "pg"), TemporarySearch: temporary, Password: true})
		connect(t, ctx, c.DSN("postgres"))
		running := mode()
		if err := c.CreateDatabase(ctx, "x", ""); err != nil {
			t.Fatal(err)
		}
		if err := c.Restart(ctx, "fast"); err != nil {
			t.Fatalf("Restart: %v", err)
		}
		connect(t, ctx, c.DSN("x"))
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := ServerPID(c.DataDir); ok {
			t.Errorf("TemporarySearch %v: the server still runs after Stop", temporary)
		}
		stopped := mode()
		switch {
		case temporary && (running != 0o700|os.ModeSetgid || stopped != 0o700|os.ModeSetgid):
			t.Errorf("TemporarySearch: the parent's mode is %v while running, %v after Stop; want %v", running, stopped, 0o700|os.ModeSetgid)
		case !temporary && stopped != 0o701|os.ModeSetgid:
			t.Errorf("without TemporarySearch: the parent's mode is %v, want %v", stopped, 0o701|os.ModeSetgid)
		}
	}
}
