package heartbeat

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// A thousand healthy agents behind one source address (a NAT, a load
// balancer that source-NATs) are all accepted, twice over: accepted
// heartbeats take nothing from the source's bucket. Refusals from that
// address still do, and a source that spent its bucket is refused at once.
func TestManyAgentsBehindOneAddress(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	agents := make([]agent, 1000)
	for i := range agents {
		agents[i] = e.addMachine(true)
	}
	client := clientFrom("127.0.0.3")
	for round := range 2 {
		var wg sync.WaitGroup
		work := make(chan agent)
		var mu sync.Mutex
		refused := map[int]int{}
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for a := range work {
					if status, _ := post(t, client, e.url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
						mu.Lock()
						refused[status]++
						mu.Unlock()
					}
				}
			}()
		}
		for _, a := range agents {
			work <- a
		}
		close(work)
		wg.Wait()
		if len(refused) > 0 {
			t.Errorf("round %d: heartbeats refused by status: %v", round, refused)
		}
	}
	if got := e.count(ResultAccepted); got != 2000 {
		t.Errorf("%g accepted, want 2000", got)
	}
	if got := e.count(ResultRateLimited); got != 0 {
		t.Errorf("%g rate limited, want 0", got)
	}

	// Forgeries from the same address spend its bucket (burst 40).
	forged := agent{machine: agents[0].machine, key: agents[1].key}
	limited := false
	for range 100 {
		status, _ := post(t, client, e.url, forged.heartbeat(t, time.Now()))
		if status == http.StatusTooManyRequests {
			limited = true
			break
		}
	}
	if !limited {
		t.Error("100 forged heartbeats from one address were never rate limited")
	}
}
