package httpinv_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"

	"example.com/httpinventory/httpinv"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

// A machine the inventory stops listing while a process holds a lease on
// it is kept, and its actions fail with a long backoff (which ends the
// lease soon); once the lease ended, the next sync removes it.
func TestSyncKeepsLeasedUntilLeaseEnds(t *testing.T) {
	ctx := t.Context()
	db := bmdbtest.NewDB(t, bmdbtest.Options{})
	var mu sync.Mutex
	listed := []httpinv.Machine{{ID: "a", Address: "10.0.0.1"}, {ID: "b", Address: "10.0.0.2"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(listed)
	}))
	defer srv.Close()
	cfg := httpinv.DefaultConfig()
	cfg.URL = srv.URL
	cfg.Agents.ActionTime, cfg.Agents.AgentStartFailureRate = 0, 0
	p, err := httpinv.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Sync(ctx)
	if err != nil || !slices.Equal(res.Added, []string{"a", "b"}) {
		t.Fatalf("first Sync: %+v, %v; want a and b added", res, err)
	}
	b := bmdbtest.ProvidedBy(t, db, httpinv.Name)["b"]

	s, err := db.StartSession(ctx, bmdbtest.SessionConfig{Component: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(t.Context()) })
	bmdbtest.Register(t, db, bmdb.Process{Name: "Test"}, bmdb.ProvidedCandidates())
	var lease *bmdbtest.Lease
	for lease == nil || lease.Machine != b.Machine {
		if lease, err = s.Claim(ctx, bmdb.Process{Name: "Test"}, bmdb.ProvidedCandidates()); err != nil {
			t.Fatalf("claiming b: %v", err)
		}
	}

	mu.Lock()
	listed = listed[:1]
	listed[0].Address = "10.0.0.10"
	mu.Unlock()
	res, err = p.Sync(ctx)
	if err != nil || !slices.Equal(res.Updated, []string{"a"}) || !slices.Equal(res.Kept, []string{"b"}) || len(res.Removed) != 0 {
		t.Fatalf("Sync with b leased: %+v, %v; want a updated and b kept", res, err)
	}
	_, err = p.StartAgent(ctx, b)
	var be *backoff.Error
	if !errors.Is(err, httpinv.ErrNotListed) || !errors.As(err, &be) || be.Backoff.Initial == 0 {
		t.Errorf("StartAgent on the unlisted leased machine: %v, want ErrNotListed with a backoff", err)
	}
	if _, err := p.StartAgent(ctx, bmdbtest.ProvidedBy(t, db, httpinv.Name)["a"]); err != nil {
		t.Errorf("StartAgent on a listed machine: %v", err)
	}

	if err := lease.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	res, err = p.Sync(ctx)
	if err != nil || !slices.Equal(res.Removed, []string{"b"}) || len(res.Kept) != 0 {
		t.Fatalf("Sync after the lease: %+v, %v; want b removed", res, err)
	}
	if _, ok := bmdbtest.ProvidedBy(t, db, httpinv.Name)["b"]; ok {
		t.Errorf("b still in the BMDB after its removal")
	}
	h := bmdbtest.Events(bmdbtest.History(t, db))
	if len(h) == 0 || h[len(h)-1] != bmdb.EventRemoved {
		t.Errorf("history %v, want it to end with Removed", h)
	}
}
