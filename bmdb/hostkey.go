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
