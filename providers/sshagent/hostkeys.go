package sshagent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// HostKeyBackoff is the backoff of a failure caused by a host key problem
// (changed, unknown, revoked). Retrying every few minutes would not fix it,
// only fill the history: an operator has to act, and then can clear the
// backoff.
var HostKeyBackoff = bmdb.Backoff{Initial: time.Hour, Maximum: 24 * time.Hour, Exponent: 2}

// PinStore keeps the host keys trusted on first use, one per machine, in
// authorized_keys format ("ssh-ed25519 AAAA...").
type PinStore interface {
	// Pinned returns the key pinned for machine and when, or "" when none
	// is.
	Pinned(ctx context.Context, machine uuid.UUID) (key string, pinnedAt time.Time, err error)
	// Pin pins key for machine unless a key is pinned already, and returns
	// the key pinned now (key, or the earlier one).
	Pin(ctx context.Context, machine uuid.UUID, key string) (pinned string, err error)
}

// BMDBPins keeps pinned host keys in the BMDB table machine_ssh_host_key,
// so that every replica trusts the same key. A pin is written in a
// transaction of its own, outside the work lease: pinning is idempotent
// (the first key wins, by primary key), so a lease lost meanwhile does no
// harm.
type BMDBPins struct {
	DB bmdb.DB
}

// Pinned implements PinStore.
func (p BMDBPins) Pinned(ctx context.Context, machine uuid.UUID) (key string, pinnedAt time.Time, err error) {
	err = p.DB.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		var err error
		key, pinnedAt, err = tx.SSHHostKey(ctx, machine)
		if errors.Is(err, bmdb.ErrNotFound) {
			key, pinnedAt, err = "", time.Time{}, nil
		}
		return err
	})
	return key, pinnedAt, err
}

// Pin implements PinStore.
func (p BMDBPins) Pin(ctx context.Context, machine uuid.UUID, key string) (pinned string, err error) {
	err = p.DB.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		var err error
		pinned, err = tx.PinSSHHostKey(ctx, machine, key)
		return err
	})
	return pinned, err
}

// plainHostKeyAlgorithms are the host key algorithms offered when no key is
// known yet. Certificates are left out on purpose: a pinned certificate
// would "change" at every renewal.
var plainHostKeyAlgorithms = []string{
	ssh.KeyAlgoED25519,
	ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521,
	ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256,
}

// algorithmsFor returns the host key algorithms that make a server present
// keys of the given types, so that a server with several host keys shows
// the one we know rather than another, equally genuine one that would look
// like a change.
func algorithmsFor(keys []ssh.PublicKey) []string {
	var algos []string
	add := func(a ...string) {
		for _, x := range a {
			if !slices.Contains(algos, x) {
				algos = append(algos, x)
			}
		}
	}
	for _, k := range keys {
		switch k.Type() {
		case ssh.KeyAlgoRSA:
			add(ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256)
		default:
			add(k.Type())
		}
	}
	return algos
}

// formatKey renders a key in authorized_keys format, without the newline.
func formatKey(k ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// hostKeyCheck verifies the host key of one connection. prepare runs
// before the handshake; callback during it; err holds the verdict of a
// refused key, so that the caller can report it rather than the handshake's
// rendering of it.
type hostKeyCheck struct {
	algorithms []string
	callback   ssh.HostKeyCallback

	mu  sync.Mutex
	err error
}

func (h *hostKeyCheck) refuse(err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		h.err = err
	}
	return err
}

func (h *hostKeyCheck) refused() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// hostKeys is the host key policy: a known_hosts file, or trust on first
// use with pins in a PinStore.
type hostKeys struct {
	knownHostsFile string
	pins           PinStore

	mu     sync.Mutex
	cached *knownHostsCache
}

// knownHostsCache is a parsed known_hosts file, reparsed when the file
// changes, so that an operator's edit takes effect without a restart.
type knownHostsCache struct {
	modTime  time.Time
	size     int64
	callback ssh.HostKeyCallback
}

func loadKnownHosts(file string) (ssh.HostKeyCallback, error) {
	cb, err := knownhosts.New(file)
	if err != nil {
		return nil, fmt.Errorf("reading known_hosts: %w", err)
	}
	return cb, nil
}

func (h *hostKeys) knownHosts() (ssh.HostKeyCallback, error) {
	st, err := os.Stat(h.knownHostsFile)
	if err != nil {
		return nil, fmt.Errorf("reading known_hosts: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.cached; c != nil && c.modTime.Equal(st.ModTime()) && c.size == st.Size() {
		return c.callback, nil
	}
	cb, err := loadKnownHosts(h.knownHostsFile)
	if err != nil {
		return nil, err
	}
	h.cached = &knownHostsCache{modTime: st.ModTime(), size: st.Size(), callback: cb}
	return cb, nil
}

// probeKey is a key no host has (an all-zero ed25519 key): checking it
// against known_hosts lists the keys known for an address.
var probeKey = func() ssh.PublicKey {
	k, err := ssh.NewPublicKey(ed25519.PublicKey(make([]byte, ed25519.PublicKeySize)))
	if err != nil {
		panic(err)
	}
	return k
}()

// prepare returns the check for one connection to t.
func (h *hostKeys) prepare(ctx context.Context, t Target) (*hostKeyCheck, error) {
	check := &hostKeyCheck{}
	if h.knownHostsFile != "" {
		cb, err := h.knownHosts()
		if err != nil {
			return nil, err
		}
		// Which keys does known_hosts hold for this address?
		var known []ssh.PublicKey
		var keyErr *knownhosts.KeyError
		if err := cb(t.Address, fakeAddr(t.Address), probeKey); errors.As(err, &keyErr) {
			for _, k := range keyErr.Want {
				known = append(known, k.Key)
			}
		}
		if len(known) == 0 {
			return nil, fmt.Errorf("%w: %s has no entry in %s; add its key (ssh-keyscan) or remove -ssh_known_hosts to trust keys on first use", ErrHostKeyUnknown, t.Address, h.knownHostsFile)
		}
		check.algorithms = algorithmsFor(known)
		check.callback = func(hostname string, remote net.Addr, key ssh.PublicKey) error {
			err := cb(hostname, remote, key)
			var keyErr *knownhosts.KeyError
			var revoked *knownhosts.RevokedError
			switch {
			case err == nil:
				return nil
			case errors.As(err, &revoked):
				return check.refuse(fmt.Errorf("%w: %s presented %s, which %s marks as revoked", ErrHostKeyChanged, t.Address, ssh.FingerprintSHA256(key), h.knownHostsFile))
			case errors.As(err, &keyErr) && len(keyErr.Want) > 0:
				want := make([]string, len(keyErr.Want))
				for i, k := range keyErr.Want {
					want[i] = fmt.Sprintf("%s (%s:%d)", ssh.FingerprintSHA256(k.Key), k.Filename, k.Line)
				}
				return check.refuse(fmt.Errorf("%w: %s presented %s %s, but known_hosts has %s; if the machine was reinstalled, update its entry", ErrHostKeyChanged, t.Address, key.Type(), ssh.FingerprintSHA256(key), strings.Join(want, ", ")))
			default:
				return check.refuse(fmt.Errorf("%w: %s presented %s: %w", ErrHostKeyUnknown, t.Address, ssh.FingerprintSHA256(key), err))
			}
		}
		return check, nil
	}

	pinned, pinnedAt, err := h.pins.Pinned(ctx, t.Machine)
	if err != nil {
		return nil, fmt.Errorf("reading pinned SSH host key: %w", err)
	}
	check.algorithms = plainHostKeyAlgorithms
	if pinned != "" {
		pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(pinned))
		if err != nil {
			return nil, fmt.Errorf("pinned SSH host key of machine %s is unreadable: %w", t.Machine, err)
		}
		check.algorithms = algorithmsFor([]ssh.PublicKey{pk})
	}
	check.callback = func(_ string, _ net.Addr, key ssh.PublicKey) error {
		got := formatKey(key)
		want := pinned
		if want == "" {
			// First use: pin it, unless a concurrent connection pinned
			// another one a moment ago.
			var err error
			if want, err = h.pins.Pin(ctx, t.Machine, got); err != nil {
				return check.refuse(fmt.Errorf("pinning SSH host key: %w", err))
			}
			pinnedAt = time.Now()
		}
		if want == got {
			return nil
		}
		wantFP := want
		if pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(want)); err == nil {
			wantFP = pk.Type() + " " + ssh.FingerprintSHA256(pk)
		}
		return check.refuse(fmt.Errorf("%w: %s presented %s %s, but %s was pinned on %s; if the machine was reinstalled, run shepherd hostkey forget %s -reason R, then shepherd backoff clear %[7]s agentstart -reason R",
			ErrHostKeyChanged, t.Address, key.Type(), ssh.FingerprintSHA256(key), wantFP, pinnedAt.UTC().Format(time.RFC3339), t.Machine))
	}
	return check, nil
}

// fakeAddr is a net.Addr for knownhosts lookups before connecting: only
// its string form is used, and an IP address in it lets known_hosts lines
// listing the IP match too.
type fakeAddr string

func (a fakeAddr) Network() string { return "tcp" }
func (a fakeAddr) String() string  { return string(a) }
