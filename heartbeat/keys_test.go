package heartbeat

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// Concurrent cache misses are read in batches, each request gets its own
// machine's key, and a machine without an agent is ErrNotFound.
func TestKeyLoaderBatches(t *testing.T) {
	e := newEnv(t, Options{})
	agents := make([]agent, 50)
	for i := range agents {
		agents[i] = e.addMachine(true)
	}
	noAgent := e.addMachine(false)
	l := &keyLoader{db: e.db, maxBatch: 500, slots: 2, timeout: 5 * time.Second}
	var wg sync.WaitGroup
	const perAgent = 4
	for i := range len(agents) * perAgent {
		wg.Add(2)
		go func() {
			defer wg.Done()
			a := agents[i%len(agents)]
			key, err := l.load(context.Background(), a.machine)
			if err != nil || !bytes.Equal(key, a.key.Public().(ed25519.PublicKey)) {
				t.Errorf("key of agent %d: %x, %v", i%len(agents), key, err)
			}
		}()
		go func() {
			defer wg.Done()
			machine := noAgent.machine
			if i%2 == 0 {
				machine = uuid.New()
			}
			if _, err := l.load(context.Background(), machine); !errors.Is(err, bmdb.ErrNotFound) {
				t.Errorf("machine without an agent: %v, want ErrNotFound", err)
			}
		}()
	}
	wg.Wait()
	n := len(agents) * perAgent * 2
	reads := l.reads.Load()
	t.Logf("%d lookups in %d reads", n, reads)
	if reads >= int64(n) {
		t.Errorf("%d lookups took %d reads: not batched", n, reads)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running != 0 || len(l.pending) != 0 {
		t.Errorf("idle loader has %d reads running, %d pending", l.running, len(l.pending))
	}
}

// A lookup waiting for a slot gives up when its context ends, and leaves
// no trace in the queue.
func TestKeyLoaderAbandon(t *testing.T) {
	e := newEnv(t, Options{})
	a := e.addMachine(true)
	l := &keyLoader{db: e.db, maxBatch: 500, slots: 1, timeout: 5 * time.Second}
	l.running = 1 // the only slot is taken
	// Its context is over before it is queued: it queues, then gives up.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.load(ctx, a.machine); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned lookup: %v, want context.Canceled", err)
	}
	l.mu.Lock()
	queued := len(l.pending)
	l.running = 0
	l.mu.Unlock()
	if queued != 0 {
		t.Errorf("%d requests still queued", queued)
	}
	if key, err := l.load(context.Background(), a.machine); err != nil || len(key) != ed25519.PublicKeySize {
		t.Errorf("later lookup: %x, %v", key, err)
	}
}

// A lookup that finds a slot free while another read is in flight waits
// the batch delay for more lookups and reads them with its own, instead of
// reading its one key at once and leaving the rest to a read after it.
func TestKeyLoaderLingersBesideARead(t *testing.T) {
	e := newEnv(t, Options{})
	agents := make([]agent, 10)
	for i := range agents {
		agents[i] = e.addMachine(true)
	}
	l := &keyLoader{db: e.db, maxBatch: 500, slots: 2, timeout: 5 * time.Second, linger: newLinger(300 * time.Millisecond)}
	l.running = 1 // a read in flight, which never ends
	var wg sync.WaitGroup
	load := func(a agent) {
		defer wg.Done()
		key, err := l.load(context.Background(), a.machine)
		if err != nil || !bytes.Equal(key, a.key.Public().(ed25519.PublicKey)) {
			t.Errorf("key of %s: %x, %v", a.machine, key, err)
		}
	}
	wg.Add(1)
	go load(agents[0])
	bmdbtest.WaitFor(t, 5*time.Second, "the first lookup to take the free slot", func() (bool, string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.running == 2 || l.reads.Load() > 0, fmt.Sprintf("%d reads running", l.running)
	})
	for _, a := range agents[1:] {
		wg.Add(1)
		go load(a)
	}
	wg.Wait()
	if reads := l.reads.Load(); reads != 1 {
		t.Errorf("%d lookups took %d reads, want 1: the lookup beside a read in flight did not wait for the others", len(agents), reads)
	}
}
