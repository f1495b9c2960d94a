package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// TestSSHHostKeyPinFirstWins pins different keys for one machine from many
// transactions at once: exactly one key is pinned, and every pinner learns
// which.
func TestSSHHostKeyPinFirstWins(t *testing.T) {
	e := newEnv(t, bmdb.Options{})
	m := e.addMachines(1)[0]
	ctx := context.Background()

	const n = 8
	results := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
				var err error
				results[i], err = tx.PinSSHHostKey(ctx, m, fmt.Sprintf("ssh-ed25519 KEY%d", i))
				return err
			})
			if err != nil {
				t.Errorf("PinSSHHostKey: %v", err)
			}
		}()
	}
	wg.Wait()
	var pinned string
	err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		pinned, _, err = tx.SSHHostKey(ctx, m)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r != pinned {
			t.Errorf("pinner %d was told %q, but %q is pinned", i, r, pinned)
		}
	}

	// Forgetting it lets the next key in; deleting the machine drops it.
	err = e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		if ok, err := tx.DeleteSSHHostKey(ctx, m); err != nil || !ok {
			return fmt.Errorf("DeleteSSHHostKey = %v, %v", ok, err)
		}
		if _, _, err := tx.SSHHostKey(ctx, m); !errors.Is(err, bmdb.ErrNotFound) {
			return fmt.Errorf("SSHHostKey after delete: %v, want ErrNotFound", err)
		}
		if got, err := tx.PinSSHHostKey(ctx, m, "ssh-ed25519 NEW"); err != nil || got != "ssh-ed25519 NEW" {
			return fmt.Errorf("PinSSHHostKey after delete = %q, %v", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.raw.Exec(ctx, `DELETE FROM machines WHERE machine_id = $1`, m); err != nil {
		t.Fatalf("deleting the machine: %v", err)
	}
	var left int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM machine_ssh_host_key`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("pinned keys left after deleting the machine: %d, %v", left, err)
	}
}
