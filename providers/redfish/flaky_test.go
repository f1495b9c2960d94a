package redfish

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// flakyTarget starts a test BMC and returns it with a target reaching it.
func flakyTarget(t *testing.T) (*redfishtest.Server, Target) {
	t.Helper()
	srv := redfishtest.Start(t, redfishtest.Options{})
	return srv, Target{Endpoint: srv.URL, CredentialsFile: srv.WriteCredentials(t, t.TempDir()), AllowHTTP: true}
}

// A BMC that drops every request is unreachable, for a read and an
// action; one that answers the wrong PowerState is believed (the client
// cannot tell; Recovery's agreeing reads can); a frozen BMC is
// unreachable after its burst, until it behaves again.
func TestFlakyBMCDropsWrongAndFreezes(t *testing.T) {
	srv, target := flakyTarget(t)
	c := New(DefaultConfig())
	ctx := context.Background()

	srv.SetFlaky(redfishtest.Flaky{Drop: 1})
	if _, err := c.PowerState(ctx, target); bmcerr.Of(err) != bmcerr.Unreachable {
		t.Errorf("power read of a BMC dropping every request: %v (class %q), want unreachable", err, bmcerr.Of(err))
	}
	if err := c.Reset(ctx, target); bmcerr.Of(err) != bmcerr.Unreachable {
		t.Errorf("reset through a BMC dropping every request: %v (class %q), want unreachable", err, bmcerr.Of(err))
	}
	if len(srv.Resets()) != 0 || srv.FlakyCounts().Dropped == 0 {
		t.Errorf("resets %v, counts %+v: want none done, some dropped", srv.Resets(), srv.FlakyCounts())
	}

	srv.SetFlaky(redfishtest.Flaky{WrongPower: 1})
	if got, err := c.PowerState(ctx, target); err != nil || got != "Off" {
		t.Errorf("power read of a BMC answering wrong (system on): %q, %v; want Off", got, err)
	}

	// Freeze after the requests of two reads.
	before := len(srv.Requests())
	if _, err := c.PowerState(ctx, target); err != nil {
		t.Fatal(err)
	}
	perRead := len(srv.Requests()) - before
	srv.SetFlaky(redfishtest.Flaky{FreezeAfter: 2 * perRead})
	var err error
	reads := 0
	for ; reads < 10; reads++ {
		if _, err = c.PowerState(ctx, target); err != nil {
			break
		}
	}
	if bmcerr.Of(err) != bmcerr.Unreachable || reads != 2 {
		t.Errorf("a BMC frozen after %d requests: %d reads answered, then %v; want 2, then unreachable", 2*perRead, reads, err)
	}
	if _, err := c.PowerState(ctx, target); bmcerr.Of(err) != bmcerr.Unreachable {
		t.Errorf("a frozen BMC answered: %v", err)
	}
	srv.SetFlaky(redfishtest.Flaky{})
	if got, err := c.PowerState(ctx, target); err != nil || got != "On" {
		t.Errorf("power read once the BMC behaves: %q, %v; want On", got, err)
	}
}

// A BMC with one session answers busy to a second conversation while the
// first is open, with the status it is given, and counts both as open at
// once.
func TestFlakyBMCSessionLimit(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusConflict} {
		srv, target := flakyTarget(t)
		c := New(DefaultConfig())
		ctx := context.Background()
		srv.SetFlaky(redfishtest.Flaky{Sessions: 1, BusyStatus: status})
		release := srv.Hold()
		var wg sync.WaitGroup
		wg.Add(1)
		var firstErr error
		go func() {
			defer wg.Done()
			_, firstErr = c.PowerState(ctx, target)
		}()
		srv.WaitOpen(t, 1, 10*time.Second)
		_, err := c.PowerState(ctx, target)
		release()
		wg.Wait()
		if bmcerr.Of(err) != bmcerr.Busy || !strings.Contains(err.Error(), "("+strconv.Itoa(status)+")") {
			t.Errorf("a second conversation beyond the limit: %v (class %q), want busy (%d)", err, bmcerr.Of(err), status)
		}
		if firstErr != nil {
			t.Errorf("the first conversation: %v", firstErr)
		}
		if n := srv.FlakyCounts(); n.MaxConversations != 2 || n.Busy != 1 {
			t.Errorf("counts %+v: want 2 conversations at most at once, 1 busy", n)
		}
	}
}
