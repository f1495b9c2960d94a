package bmdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// SSHHostKey reads the SSH host key pinned for machine (in authorized_keys
// format) and when it was pinned. It returns an error wrapping ErrNotFound
// when none is.
func (t *Tx) SSHHostKey(ctx context.Context, machine uuid.UUID) (key string, pinnedAt time.Time, err error) {
	err = t.tx.QueryRow(ctx, qSSHHostKeyGet, machine).Scan(&key, &pinnedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", time.Time{}, fmt.Errorf("no SSH host key pinned for %s: %w", machine, ErrNotFound)
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("reading SSH host key of %s: %w", machine, err)
	}
	return key, pinnedAt, nil
}

// PinSSHHostKey pins key as machine's SSH host key unless one is pinned
// already, and returns the key pinned now: key itself, or the one pinned
// earlier (possibly a moment ago by a concurrent transaction), which the
// caller must compare with what it saw.
func (t *Tx) PinSSHHostKey(ctx context.Context, machine uuid.UUID, key string) (pinned string, err error) {
	if _, err := t.tx.Exec(ctx, qSSHHostKeyPin, machine, key); err != nil {
		return "", fmt.Errorf("pinning SSH host key of %s: %w", machine, err)
	}
	pinned, _, err = t.SSHHostKey(ctx, machine)
	return pinned, err
}

// DeleteSSHHostKey forgets the SSH host key pinned for machine, so that the
// next connection trusts (and pins) whatever key the machine presents. It
// reports whether a key was pinned.
func (t *Tx) DeleteSSHHostKey(ctx context.Context, machine uuid.UUID) (bool, error) {
	tag, err := t.tx.Exec(ctx, qSSHHostKeyDelete, machine)
	if err != nil {
		return false, fmt.Errorf("forgetting SSH host key of %s: %w", machine, err)
	}
	return tag.RowsAffected() > 0, nil
}

// EventHostKeyForgotten records that an operator forgot a machine's pinned
// SSH host key (after a reinstall), so that the next connection pins the key
// it then presents: a trust decision, audited like the other operator
// actions.
const EventHostKeyForgotten Event = "HostKeyForgotten"

// PinnedHostKey is a machine's pinned SSH host key, in authorized_keys
// format, with the machine's names.
type PinnedHostKey struct {
	Provided
	Key      string
	PinnedAt time.Time
}

// ForgetSSHHostKey forgets machine's pinned SSH host key and records
// HostKeyForgotten in its history with reason and describe(key) (a
// fingerprint, so that the history says which key was let go). It returns
// the forgotten key, or an error wrapping ErrNotFound when none is pinned.
func (db *DB) ForgetSSHHostKey(ctx context.Context, machine uuid.UUID, reason string, describe func(key string) string) (PinnedHostKey, error) {
	if reason == "" {
		return PinnedHostKey{}, ErrReasonRequired
	}
	var forgotten PinnedHostKey
	err := db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		key, _, err := tx.SSHHostKey(ctx, machine)
		if err != nil {
			return err
		}
		// The key read above is the one deleted: a key pinned anew in
		// between is not forgotten unseen.
		err = tx.tx.QueryRow(ctx, qHostKeyForget, machine, reason+" (forgot "+describe(key)+")", key, ActorArg(ActorFrom(ctx))).Scan(&forgotten.Key, &forgotten.PinnedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("the pinned key changed meanwhile: %w", ErrNotFound)
		}
		return err
	})
	if err != nil {
		return PinnedHostKey{}, fmt.Errorf("forgetting the SSH host key of %s: %w", machine, err)
	}
	forgotten.Machine = machine
	return forgotten, nil
}

// SSHHostKeys lists pinned SSH host keys by provider and provider id, at
// most limit (default 1000) after (afterProvider, afterProviderID).
func (db *DB) SSHHostKeys(ctx context.Context, afterProvider, afterProviderID string, limit int) ([]PinnedHostKey, error) {
	if limit <= 0 {
		limit = 1000
	}
	keys, err := queryRows(ctx, db.pool, scanPinnedHostKey, qHostKeys, afterProvider, afterProviderID, limit)
	if err != nil {
		return nil, fmt.Errorf("listing pinned SSH host keys: %w", err)
	}
	return keys, nil
}

func scanPinnedHostKey(row pgx.CollectableRow) (PinnedHostKey, error) {
	var k PinnedHostKey
	err := row.Scan(&k.Machine, &k.Provider, &k.ProviderID, &k.Address, &k.Key, &k.PinnedAt)
	return k, err
}
