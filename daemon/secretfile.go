package daemon

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/shepherd-fleet/shepherd/untrusted"
)

// maxSecretFile bounds a secret file: a token or a password is a line.
const maxSecretFile = 64 << 10

// readSecretFile reads a secret (a token) from path, refusing what OpenSSH
// refuses for a private key: a file that group or others may read (anyone
// on the machine could use the secret), or that is not a regular file (a
// FIFO would block, a device could be endless). The content is trimmed and
// must not be empty; it never appears in an error.
func readSecretFile(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	switch {
	case !info.Mode().IsRegular():
		return "", fmt.Errorf("%s is not a regular file", path)
	case info.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("%s is readable by others (mode %#o): make it 0600 or 0400 (in Kubernetes, the secret volume's defaultMode)", path, info.Mode().Perm())
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, cut, err := untrusted.Read(f, maxSecretFile)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	if cut {
		return "", fmt.Errorf("%s is larger than %d bytes: not a secret", path, maxSecretFile)
	}
	secret := strings.TrimSpace(string(data))
	if secret == "" {
		return "", errors.New(path + " is empty")
	}
	return secret, nil
}
