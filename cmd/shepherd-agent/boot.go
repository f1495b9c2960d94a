package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"

	"github.com/google/uuid"
)

// readBootID reads the boot identity from path (Linux's
// /proc/sys/kernel/random/boot_id: a UUID and a newline). Shepherd counts
// a reset as done only when the agent heartbeats with a new one.
func readBootID(path string) (uuid.UUID, error) {
	if path == "" {
		return uuid.Nil, fmt.Errorf("-boot_id_file is empty")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return uuid.Nil, fmt.Errorf("reading the boot identity: %w", err)
	}
	s := string(bytes.TrimSpace(b))
	id, err := uuid.Parse(s)
	if err != nil || id == uuid.Nil || len(s) != 36 {
		return uuid.Nil, fmt.Errorf("reading the boot identity: %s holds %q, not a UUID", path, truncate(s, 64))
	}
	return id, nil
}

// executableDigest is the SHA-256 of the running binary: the build
// digest the heartbeats carry, which an operator compares with
// `sha256sum shepherd-agent`.
func executableDigest() ([32]byte, error) {
	var d [32]byte
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		exe, eerr := os.Executable()
		if eerr != nil {
			return d, fmt.Errorf("finding the agent binary: %w", eerr)
		}
		if f, err = os.Open(exe); err != nil {
			return d, fmt.Errorf("reading the agent binary: %w", err)
		}
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return d, fmt.Errorf("reading the agent binary: %w", err)
	}
	copy(d[:], h.Sum(nil))
	return d, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
