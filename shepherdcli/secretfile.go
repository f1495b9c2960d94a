package shepherdcli

import (
	"errors"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/secretfile"
)

// maxSecretFile bounds a secret file: a token is a line.
const maxSecretFile = 64 << 10

// readSecretFile reads a token from path (see package secretfile: owner
// only, a regular file, bounded), trimmed; it must not be empty, and it
// never appears in an error.
func readSecretFile(path string) (string, error) {
	data, err := secretfile.Read(path, maxSecretFile)
	if err != nil {
		return "", err
	}
	secret := strings.TrimSpace(string(data))
	if secret == "" {
		return "", errors.New(path + " is empty")
	}
	return secret, nil
}
