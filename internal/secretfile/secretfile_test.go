package secretfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(write("target", 0o400, "secret"), link); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		write("ok", 0o600, "secret"):      "",
		link:                              "",
		write("group", 0o640, "secret"):   "accessible by others (mode 0640)",
		write("world", 0o644, "secret"):   "accessible by others (mode 0644)",
		write("big", 0o600, "0123456789"): "larger than 8 bytes",
		fifo:                              "not a regular file",
		"/dev/zero":                       "not a regular file",
		filepath.Join(dir, "missing"):     "no such file",
	} {
		data, err := Read(path, 8)
		switch {
		case want == "" && (err != nil || string(data) != "secret"):
			t.Errorf("Read(%s) = %q, %v; want the secret", path, data, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("Read(%s) = %v, want an error with %q", path, err, want)
		}
	}
}

// A file that another user owns is refused even with mode 0600: as root,
// one owned by nobody; a file of ours (or root's) is read.
func TestReadRefusesAnotherOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can give a file to another user")
	}
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p, 64); err != nil {
		t.Fatalf("Read of root's own 0600 file: %v", err)
	}
	const nobody = 65534
	if err := os.Chown(p, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	_, err := Read(p, 64)
	if err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("Read of nobody's 0600 file: %v, want refused as owned by uid 65534", err)
	}
}
