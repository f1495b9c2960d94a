package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// loadOrCreateKey loads the agent's key from path, or creates it there. The
// key survives agent restarts: a machine whose agent AgentStart restarts
// keeps its identity unless the file is removed.
func loadOrCreateKey(path string) (key ed25519.PrivateKey, created bool, err error) {
	key, err = loadKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, false, err
	}
	_, key, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("generating a key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, false, fmt.Errorf("encoding the key: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("creating the key directory: %w", err)
	}
	// Written whole to a temporary file (mode 0600 from CreateTemp), then
	// linked into place: link fails if the name exists, so two agents
	// starting at once agree on the first key, and nobody ever reads a
	// half-written one.
	tmp, err := os.CreateTemp(dir, ".key-*")
	if err != nil {
		return nil, false, fmt.Errorf("creating the key file: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, false, fmt.Errorf("writing the key file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			key, err := loadKey(path)
			return key, false, err
		}
		return nil, false, fmt.Errorf("installing the key file: %w", err)
	}
	return key, true, nil
}

// loadKey reads a PKCS#8 PEM ed25519 key. Errors wrap fs.ErrNotExist when
// there is no file. A key readable by anyone but its owner is refused: it
// may have been copied, and whoever holds it can keep a dead machine out of
// Recovery.
func loadKey(path string) (ed25519.PrivateKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening the key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading the key file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("key file %s has mode %#o, open to other users: make it 0600 (or remove it for a new key)", path, st.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return nil, fmt.Errorf("reading the key file: %w", err)
	}
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("key file %s does not hold one PEM PRIVATE KEY block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key file %s holds a %T, not an ed25519 key", path, k)
	}
	return key, nil
}

// pidLockTimeout bounds how long a starting agent waits for the previous
// one to exit: SIGTERM at once, SIGKILL after pidKillAfter.
const (
	pidLockTimeout = 10 * time.Second
	pidKillAfter   = 5 * time.Second
)

// lockPIDFile takes the exclusive lock on path, terminating the agent that
// holds it, and writes this process's pid into it. The lock, not the pid,
// says who runs: it dies with its holder, so a stale file (after a crash or
// a reboot) never blocks a start. The returned file must stay open while
// the agent runs. An empty path means no pid file.
func lockPIDFile(path string, logger *log.Logger) (*os.File, error) {
	if path == "" {
		return nil, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating the pid file directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the pid file: %w", err)
	}
	start := time.Now()
	var termAt time.Time
	killed := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking the pid file: %w", err)
		}
		if time.Since(start) > pidLockTimeout {
			f.Close()
			return nil, fmt.Errorf("the agent holding %s did not exit within %s", path, pidLockTimeout)
		}
		if pid := holder(f); pid > 0 {
			switch {
			case termAt.IsZero():
				logger.Printf("terminating the previous agent, pid %d", pid)
				_ = syscall.Kill(pid, syscall.SIGTERM)
				termAt = time.Now()
			case !killed && time.Since(termAt) > pidKillAfter:
				logger.Printf("killing the previous agent, pid %d", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				killed = true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, fmt.Errorf("writing the pid file: %w", err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("writing the pid file: %w", err)
	}
	return f, nil
}

// holder returns the pid written in the locked pid file f, if that process
// has the file open: the file may still hold a dead agent's pid for a moment
// after a new holder locked it, and that pid may have been recycled by a
// process that is none of ours.
func holder(f *os.File) int {
	data := make([]byte, 32)
	n, _ := f.ReadAt(data, 0)
	pid, err := strconv.Atoi(string(bytes.TrimSpace(data[:n])))
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return 0
	}
	ours, err := f.Stat()
	if err != nil {
		return 0
	}
	fds := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fds)
	if err != nil {
		return 0
	}
	for _, e := range entries {
		if st, err := os.Stat(filepath.Join(fds, e.Name())); err == nil && os.SameFile(st, ours) {
			return pid
		}
	}
	return 0
}
