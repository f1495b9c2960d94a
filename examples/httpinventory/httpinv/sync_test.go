package httpinv_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/controlloop/controlloopt"

	"example.com/httpinventory/httpinv"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

// A machine the inventory stops listing while a process holds a lease on
// it is kept, and its actions fail with a long backoff (which ends the
// lease soon); once the lease ended, the next sync removes it.
func TestSyncKeepsLeasedUntilLeaseEnds(t *testing.T) {
	ctx := t.Context()
	db := bmdbtest.Open(t, bmdbtest.NewDatabase(t))
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

	// A process holds a lease on b: its handler runs until released.
	leased, release := make(chan struct{}), make(chan struct{})
	holder := controlloop.Definition{
		Info:       controlloop.Info{Process: bmdb.Process{Name: "Test"}, Label: "test"},
		Candidates: func() (bmdb.Candidates, error) { return bmdb.ProvidedCandidates(), nil },
		New: func(controlloop.Env) (controlloop.Handler, error) {
			return controlloop.HandlerFunc(func(context.Context, *controlloop.Task) error {
				close(leased)
				<-release
				return nil
			}), nil
		},
	}
	run := controlloopt.Start(t, db, holder, b.Machine, controlloopt.Options{})
	select {
	case <-leased:
	case <-time.After(controlloopt.DefaultTimeout):
		t.Fatal("the lease on b was not taken")
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

	close(release)
	if res := run.Wait(t); res.Event != bmdb.EventFinished {
		t.Fatalf("the lease on b ended %s, want Finished", res.Event)
	}
	res, err = p.Sync(ctx)
	if err != nil || !slices.Equal(res.Removed, []string{"b"}) || len(res.Kept) != 0 {
		t.Fatalf("Sync after the lease: %+v, %v; want b removed", res, err)
	}
	if _, ok := bmdbtest.ProvidedBy(t, db, httpinv.Name)["b"]; ok {
		t.Errorf("b still in the BMDB after its removal")
	}
	hist, err := db.History(ctx, b.Machine)
	if err != nil {
		t.Fatal(err)
	}
	h := bmdbtest.Events(hist)
	if len(h) == 0 || h[len(h)-1] != bmdb.EventRemoved {
		t.Errorf("history %v, want it to end with Removed", h)
	}
}
