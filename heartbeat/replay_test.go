package heartbeat

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A captured heartbeat replayed to another replica, or to a restarted one
// (a new Server over the same BMDB), is refused: the BMDB keeps the
// agent's last recorded timestamp. A newer heartbeat is accepted anywhere.
func TestReplayRefusedAcrossReplicasAndRestarts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	a := e.addMachine(true)
	other := httptest.NewServer(New(e.db, Options{}).Handler())
	defer other.Close()
	client := clientFrom("127.0.0.4")

	captured := a.heartbeat(t, time.Now())
	if status, body := post(t, client, e.url, captured); status != http.StatusNoContent {
		t.Fatalf("first heartbeat: %d %q", status, body)
	}
	if status, body := post(t, client, other.URL+Path, captured); status != http.StatusForbidden || !strings.HasPrefix(body, "replay:") {
		t.Errorf("the captured heartbeat replayed to another replica: %d %q, want 403 replay", status, body)
	}
	restarted := httptest.NewServer(New(e.db, Options{}).Handler())
	defer restarted.Close()
	if status, body := post(t, client, restarted.URL+Path, captured); status != http.StatusForbidden || !strings.HasPrefix(body, "replay:") {
		t.Errorf("the captured heartbeat replayed after a restart: %d %q, want 403 replay", status, body)
	}
	if status, body := post(t, client, other.URL+Path, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Errorf("a newer heartbeat to the other replica: %d %q", status, body)
	}
}
