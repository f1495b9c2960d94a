package heartbeat

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// Concurrent requests, a third of them forged, are verified in shared
// batches, and each gets the answer for its own heartbeat; when the work is
// done no worker is left running.
func TestVerifierAnswersEachRequestOfABatch(t *testing.T) {
	v := newVerifier()
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	const requests = 600
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range requests {
		hb, err := agentproto.NewHeartbeat(uuid.New(), time.Now(), uuid.New(), [agentproto.DigestSize]byte{}, key)
		if err != nil {
			t.Fatal(err)
		}
		forged := i%3 == 0
		checkWith := pub
		if forged {
			checkWith = otherPub
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if got := v.verify(hb, checkWith); got == forged {
				t.Errorf("request %d (forged: %v): verified %v", i, forged, got)
			}
		}()
	}
	close(start)
	wg.Wait()
	if v.batched.Load() == 0 {
		t.Errorf("%d concurrent requests were verified one by one", requests)
	}
	// The last worker answers its batch, then finds the queue empty.
	bmdbtest.WaitFor(t, 10*time.Second, "the verification workers to stop", func() (bool, string) {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.workers == 0 && len(v.queue) == 0, fmt.Sprintf("%d workers, %d queued", v.workers, len(v.queue))
	})
}
