package heartbeat

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestPreload reads every agent's key in pages before any heartbeat: the
// agents' first heartbeats are then accepted without a key lookup, a
// machine without an agent is not cached, and a machine whose heartbeat
// came before the preload keeps its entry.
func TestPreload(t *testing.T) {
	e := newEnv(t, Options{})
	e.srv.preloadPage = 3
	early := e.addMachine(true)
	if status, body := post(t, http.DefaultClient, e.url, early.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("first heartbeat: %d %q", status, body)
	}
	e.srv.mu.Lock()
	before := e.srv.machines[early.machine]
	e.srv.mu.Unlock()
	lookups := e.srv.keys.lookups.Load()

	agents := make([]agent, 10)
	for i := range agents {
		agents[i] = e.addMachine(true)
	}
	bare := e.addMachine(false)
	n, err := e.srv.Preload(context.Background())
	if err != nil {
		t.Fatalf("Preload: %v", err)
	}
	if n != len(agents) {
		t.Errorf("Preload cached %d keys, want %d (the early machine was cached already)", n, len(agents))
	}
	e.srv.mu.Lock()
	after := e.srv.machines[early.machine]
	_, bareCached := e.srv.machines[bare.machine]
	e.srv.mu.Unlock()
	if after != before {
		t.Errorf("the early machine's entry changed: %+v, was %+v", after, before)
	}
	if bareCached {
		t.Error("a machine without an agent was cached")
	}
	for _, a := range agents {
		if status, body := post(t, http.DefaultClient, e.url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
			t.Fatalf("heartbeat after the preload: %d %q", status, body)
		}
	}
	if got := e.srv.keys.lookups.Load(); got != lookups {
		t.Errorf("%d key lookups after the preload, want none", got-lookups)
	}
}

// TestPreloadLeavesRoom preloads a fleet larger than the cache: it stops a
// thirty-second short of MaxMachines, and the agents it left out are
// still accepted, their keys read as they heartbeat.
func TestPreloadLeavesRoom(t *testing.T) {
	e := newEnv(t, Options{MaxMachines: 64})
	e.srv.preloadPage = 5
	agents := make([]agent, 70)
	for i := range agents {
		agents[i] = e.addMachine(true)
	}
	n, err := e.srv.Preload(context.Background())
	if err != nil {
		t.Fatalf("Preload: %v", err)
	}
	if want := 64 - 64/32; n != want {
		t.Errorf("Preload cached %d keys, want %d", n, want)
	}
	for _, a := range agents {
		if status, body := post(t, http.DefaultClient, e.url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
			t.Fatalf("heartbeat: %d %q", status, body)
		}
	}
}
