package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeMachine is a PATH with recording apt-get and sudo and an id that
// answers uid, and a file root with nothing installed: install-deps run
// there behaves as on a fresh Debian machine, without installing anything.
func fakeMachine(t *testing.T, uid string) (env []string, log string) {
	t.Helper()
	bin := t.TempDir()
	log = filepath.Join(t.TempDir(), "calls")
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("apt-get", `echo "apt-get $*" >> `+log+"\n")
	write("sudo", `echo "sudo" >> `+log+"\nexec \"$@\"\n")
	write("id", "echo "+uid+"\n")
	return []string{"PATH=" + bin, "SHEPHERD_DEPS_ROOT=" + filepath.Join(t.TempDir(), "empty")}, log
}

func runInstall(t *testing.T, env []string, target string) (string, error) {
	t.Helper()
	cmd := exec.Command("/bin/bash", "install-deps", target)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func calls(t *testing.T, log string) []string {
	t.Helper()
	raw, err := os.ReadFile(log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(raw)), "\n")
}

// On a fresh machine, `make test` installs every package the tests use,
// through sudo when not root; `make demo` only PostgreSQL.
func TestInstallDepsOnAFreshMachine(t *testing.T) {
	for _, tc := range []struct {
		target, uid string
		want        []string
	}{
		{"test", "1000", []string{"sudo", "apt-get update", "sudo", "apt-get install -y --no-install-recommends postgresql openssh-server prometheus chromium patroni etcd-server pgbouncer openipmi ipmitool"}},
		{"test", "0", []string{"apt-get update", "apt-get install -y --no-install-recommends postgresql openssh-server prometheus chromium patroni etcd-server pgbouncer openipmi ipmitool"}},
		{"demo", "1000", []string{"sudo", "apt-get update", "sudo", "apt-get install -y --no-install-recommends postgresql"}},
	} {
		env, log := fakeMachine(t, tc.uid)
		out, err := runInstall(t, env, tc.target)
		if err != nil {
			t.Fatalf("install-deps %s as uid %s: %v\n%s", tc.target, tc.uid, err, out)
		}
		if got := calls(t, log); !slices.Equal(got, tc.want) {
			t.Errorf("install-deps %s as uid %s ran\n%q\nwant\n%q", tc.target, tc.uid, got, tc.want)
		}
	}
}

// On a prepared machine nothing is installed, and apt is not touched.
func TestInstallDepsOnAPreparedMachine(t *testing.T) {
	env, log := fakeMachine(t, "1000")
	bin := strings.TrimPrefix(env[0], "PATH=")
	for _, tool := range []string{"initdb", "prometheus", "chromium", "patronictl", "etcd", "pgbouncer", "ipmi_sim", "ipmitool"} {
		if err := os.WriteFile(filepath.Join(bin, tool), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root := strings.TrimPrefix(env[1], "SHEPHERD_DEPS_ROOT=")
	if err := os.MkdirAll(filepath.Join(root, "usr/sbin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/sshd"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := runInstall(t, env, "test"); err != nil {
		t.Fatalf("install-deps test: %v\n%s", err, out)
	}
	if got := calls(t, log); got != nil {
		t.Errorf("a prepared machine still ran %q", got)
	}
}

func TestInstallDepsRefusesUnknownTarget(t *testing.T) {
	env, _ := fakeMachine(t, "0")
	out, err := runInstall(t, env, "everything")
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 || !strings.Contains(out, "usage: install-deps demo|test") {
		t.Errorf("install-deps everything: %v, %q; want exit 2 with the usage", err, out)
	}
}

// The README's two commands are the Makefile's targets, each of which runs
// install-deps first, and CI runs the README's test command.
func TestTwoCommandsAreWired(t *testing.T) {
	read := func(path string) string {
		raw, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	readme, makefile, ci := read("README.md"), read("Makefile"), read(".ci/run")
	for _, cmd := range []string{"make demo", "make test"} {
		if !strings.Contains(readme, "\n"+cmd) {
			t.Errorf("README.md does not start with %q", cmd)
		}
	}
	for _, rule := range []string{"demo:\n\tscripts/install-deps demo\n", "test:\n\tscripts/install-deps test\n"} {
		if !strings.Contains(makefile, rule) {
			t.Errorf("Makefile lacks %q", rule)
		}
	}
	if !strings.Contains(ci, "make test") {
		t.Error(".ci/run does not run `make test`")
	}
}
