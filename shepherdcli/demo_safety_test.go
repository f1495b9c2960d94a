package shepherdcli

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// Demo mode runs only with a simulated fleet, and a DSN given but empty is
// no request for it: each such command line exits 2, with one line, before
// starting anything (no state directory appears).
func TestDemoModeRefused(t *testing.T) {
	t.Parallel()
	inventory := filepath.Join(t.TempDir(), "inventory.yaml")
	if err := os.WriteFile(inventory, []byte("machines: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"static without DSN", replicatest.EnvWithoutDSN(), []string{"-provider=static", "-inventory=" + inventory, "-agent_listen=127.0.0.1:0"}, "-provider static: no database given"},
		{"static with an empty $" + envDSN, replicatest.EnvWithoutDSN(envDSN + "="), []string{"-provider=static", "-inventory=" + inventory, "-agent_listen=127.0.0.1:0"}, "$" + envDSN + " is set but empty"},
		{"sim with an empty $" + envDSN, replicatest.EnvWithoutDSN(envDSN + "= "), nil, "$" + envDSN + " is set but empty"},
		{"an empty -bmdb_dsn", replicatest.EnvWithoutDSN(), []string{"-bmdb_dsn="}, "-bmdb_dsn is empty"},
		{"migrate with an empty $" + envDSN, replicatest.EnvWithoutDSN(envDSN + "="), []string{"migrate", "up"}, "$" + envDSN + " is set but empty"},
		{"machines with an empty $" + envDSN, replicatest.EnvWithoutDSN(envDSN + "="), []string{"machines"}, "$" + envDSN + " is set but empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			stateDir := filepath.Join(t.TempDir(), "state")
			args := c.args
			if len(args) == 0 || args[0] != "migrate" { // migrate has no state
				args = append(args, "-state_dir="+stateDir)
			}
			code, stdout, stderr := runShepherd(t, c.env, args...)
			if code != exitUsage || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2 and one line with %q", code, stdout, stderr, c.want)
			}
			if _, err := os.Stat(stateDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the state directory was created (%v): demo mode started", err)
			}
		})
	}
}

// A status token file of mode 0600 that another user owns is refused at
// start (exit 2): that user could choose the token of a root daemon.
func TestStatusTokenFileOfAnotherUserRefused(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("only root can give a file to another user")
	}
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(token, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), "-bmdb_dsn=postgres://u@127.0.0.1:1/nowhere", "-status_token_file="+token)
	if code != exitUsage || !strings.Contains(stderr, "owned by uid 65534") {
		t.Errorf("exit %d %q, want 2 and the file's owner named", code, stderr)
	}
}

// The operator commands use ./.shepherd/demo.dsn only if it is the demo's:
// an owner-only regular file owned by the caller or root. One that others
// may read, a symbolic link, a FIFO, or (as root) one owned by nobody is
// refused, naming the file, and its database never contacted.
func TestCLIRefusesForeignDemoDSN(t *testing.T) {
	t.Parallel()
	// Were the file used, the command would try this server and fail
	// differently (or, with a real one, act on it).
	const dsn = "postgres://postgres:pw@127.0.0.1:1/shepherd?sslmode=disable&connect_timeout=2"
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, path string)
		want  string
	}{
		{"readable by others", func(t *testing.T, path string) { writeModeFile(t, path, dsn, 0o644) }, "accessible by others (mode 0644)"},
		{"a symbolic link", func(t *testing.T, path string) {
			target := filepath.Join(t.TempDir(), "elsewhere")
			writeModeFile(t, target, dsn, 0o600)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, "is a symbolic link"},
		{"a FIFO", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"owned by nobody", func(t *testing.T, path string) {
			if os.Geteuid() != 0 {
				t.Skip("only root can give a file to another user")
			}
			writeModeFile(t, path, dsn, 0o600)
			if err := os.Chown(path, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 65534"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			stateDir := t.TempDir()
			c.setup(t, filepath.Join(stateDir, demoDSNFile))
			code, stdout, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), "machines", "-state_dir", stateDir)
			if code == exitOK || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "not used") {
				t.Errorf("exit %d, stdout %q, stderr %q; want a failure with %q", code, stdout, stderr, c.want)
			}
			if u, _ := url.Parse(dsn); strings.Contains(stderr, u.Host) {
				t.Errorf("stderr names the planted database: %q", stderr)
			}
		})
	}
}

func writeModeFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
