// Package secretfile reads files that hold secrets (private keys,
// passwords, tokens) the way OpenSSH reads a private key: refusing a file
// that group or others may read, since anyone on the machine could then use
// the secret; a file owned by another user than us or root, since that user
// could then choose the secret (a root daemon's token, or the key it logs
// in with); and anything but a regular file, since a FIFO blocks and a
// device may never end.
package secretfile

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Check refuses path unless it is a regular file (symlinks followed, as
// Kubernetes secret volumes use them) that only its owner may read, owned
// by us or root (see CheckInfo).
func Check(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return CheckInfo(path, info)
}

// CheckInfo is Check of a file already stat'ed (or opened and fstat'ed),
// named path in errors: a regular file, mode 0600 or stricter, whose owner
// is our effective user or root, as OpenSSH requires of a private key.
func CheckInfo(path string, info fs.FileInfo) error {
	switch {
	case !info.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	case info.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%s is accessible by others (mode %#o): make it 0600 or 0400 (in Kubernetes, the secret volume's defaultMode)", path, info.Mode().Perm())
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		if uid := int(st.Uid); uid != os.Geteuid() && uid != 0 {
			return fmt.Errorf("%s is owned by uid %d, neither us (uid %d) nor root: its owner could choose the secret; chown it", path, uid, os.Geteuid())
		}
	}
	return nil
}

// Read checks path (see Check) and reads at most limit bytes of it; a
// larger file is an error, since it is no secret of the expected kind.
func Read(path string, limit int64) ([]byte, error) {
	if err := Check(path); err != nil {
		return nil, err
	}
	return untrusted.ReadFile(path, limit)
}
