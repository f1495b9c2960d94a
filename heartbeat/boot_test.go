package heartbeat

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// bootEnv is an endpoint over a BMDB whose metrics are registered, so
// that shepherd_recovery_duration_seconds can be read.
func bootEnv(t *testing.T) (*env, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	db := bmdbtest.NewDB(t, bmdb.Options{Metrics: bmdb.NewMetrics(reg)})
	opts := Options{Metrics: NewMetrics(reg)}
	srv := New(db, opts)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &env{t: t, db: db, srv: srv, metrics: opts.Metrics, url: ts.URL + Path}, reg
}

// reset records a Recovery reset of a's machine, as Recovery's commit does,
// and records the agent again, as AgentStart does after it (the agent
// keeps its key across restarts).
func reset(t *testing.T, db *bmdb.DB, a agent, verify time.Duration) bmdb.ResetVerification {
	t.Helper()
	var v bmdb.ResetVerification
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		v, err = tx.RecordReset(ctx, a.machine, "ShepherdRecovery", verify)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, a.machine, a.key.Public().(ed25519.PublicKey))
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func events(t *testing.T, db *bmdb.DB, machine uuid.UUID, event bmdb.Event) []bmdb.HistoryEntry {
	t.Helper()
	h, err := db.History(context.Background(), machine)
	if err != nil {
		t.Fatal(err)
	}
	var out []bmdb.HistoryEntry
	for _, e := range h {
		if e.Event == event {
			out = append(out, e)
		}
	}
	return out
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A machine reset is recorded back (Recovered, with the time it took) only
// when its agent heartbeats with another boot identity than before the
// reset: the agent restarted in the same boot (a BMC that accepted the
// reset and did nothing) leaves the reset pending.
func TestRecoveredOnlyWithANewBoot(t *testing.T) {
	t.Parallel()
	e, reg := bootEnv(t)
	a := e.addMachine(true)
	client := clientFrom("127.0.0.5")
	boot := firstBoot(a.machine)
	if status, body := post(t, client, e.url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("heartbeat: %d %q", status, body)
	}
	if got := bmdbtest.BootOf(t, e.db, a.machine); got != boot {
		t.Fatalf("boot_id recorded %s, want %s", got, boot)
	}
	v := reset(t, e.db, a, time.Hour)
	if !v.Verified || v.BootBefore != boot {
		t.Fatalf("reset recorded %+v, want verified from boot %s", v, boot)
	}
	// The same boot: not back.
	if status, body := post(t, client, e.url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("heartbeat in the same boot: %d %q", status, body)
	}
	if n := len(events(t, e.db, a.machine, bmdb.EventRecovered)); n != 0 {
		t.Fatalf("%d Recovered after a heartbeat in the boot of before the reset", n)
	}
	if _, err := pendingReset(t, e.db, a.machine); err != nil {
		t.Fatalf("the reset is no longer pending: %v", err)
	}
	// A new boot: back.
	second := uuid.New()
	if status, body := post(t, client, e.url, a.heartbeatIn(t, time.Now(), second)); status != http.StatusNoContent {
		t.Fatalf("heartbeat in a new boot: %d %q", status, body)
	}
	rec := events(t, e.db, a.machine, bmdb.EventRecovered)
	if len(rec) != 1 || rec[0].Process != "ShepherdRecovery" || !strings.Contains(rec[0].Cause, "back after") {
		t.Fatalf("Recovered events %+v, want one of ShepherdRecovery saying how long it took", rec)
	}
	if _, err := pendingReset(t, e.db, a.machine); err == nil {
		t.Error("the reset is still pending after the machine came back")
	}
	if got := bmdbtest.BootOf(t, e.db, a.machine); got != second {
		t.Errorf("boot_id recorded %s, want %s", got, second)
	}
	if n := histogramCount(t, reg, "shepherd_recovery_duration_seconds"); n != 1 {
		t.Errorf("shepherd_recovery_duration_seconds has %d samples, want 1", n)
	}
	stats, err := e.db.RecoveryStats(context.Background(), time.Hour)
	if err != nil || stats.Recovered != 1 || stats.Worst < stats.Median || stats.Waiting != 0 || stats.Overdue != 0 {
		t.Errorf("RecoveryStats %+v, %v: want one recovery, none pending", stats, err)
	}
	// Later heartbeats of the new boot record nothing more.
	if status, _ := post(t, client, e.url, a.heartbeatIn(t, time.Now(), second)); status != http.StatusNoContent {
		t.Fatal("heartbeat refused")
	}
	if n := len(events(t, e.db, a.machine, bmdb.EventRecovered)); n != 1 {
		t.Errorf("%d Recovered, want still 1", n)
	}
}

func pendingReset(t *testing.T, db *bmdb.DB, machine uuid.UUID) (bmdb.ResetState, error) {
	t.Helper()
	var r bmdb.ResetState
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		r, err = tx.PendingReset(ctx, machine)
		return err
	})
	return r, err
}

// An agent of today's protocol (heartbeat version 1, no boot identity)
// still heartbeats and is accepted. Its machine's reboots cannot be
// verified: its first heartbeat after a reset ends the reset, whichever
// boot it runs in, and records no Recovered.
func TestVersion1AgentAccepted(t *testing.T) {
	t.Parallel()
	e, _ := bootEnv(t)
	a := e.addMachine(true)
	client := clientFrom("127.0.0.6")
	// A reset before any heartbeat: any boot identity would count.
	if v := reset(t, e.db, a, time.Hour); !v.Verified || v.BootBefore != uuid.Nil {
		t.Fatalf("reset of a machine that never heartbeated: %+v", v)
	}
	body := a.heartbeatV1(t, time.Now())
	if !strings.Contains(string(body), `"version":1`) || strings.Contains(string(body), "boot_id") {
		t.Fatalf("not a version 1 body: %s", body)
	}
	if status, resp := post(t, client, e.url, body); status != http.StatusNoContent {
		t.Fatalf("version 1 heartbeat: %d %q, want 204", status, resp)
	}
	if got := e.lastHeartbeat(a.machine); got.IsZero() {
		t.Fatal("version 1 heartbeat not recorded")
	}
	if got := bmdbtest.BootOf(t, e.db, a.machine); got != uuid.Nil {
		t.Errorf("boot_id %s recorded from a version 1 heartbeat", got)
	}
	if _, err := pendingReset(t, e.db, a.machine); err == nil {
		t.Error("a version 1 heartbeat left the reset pending: the machine would be reset again and again")
	}
	if n := len(events(t, e.db, a.machine, bmdb.EventRecovered)); n != 0 {
		t.Errorf("%d Recovered from a version 1 heartbeat, which cannot prove a reboot", n)
	}
	// A reset of a machine whose agent is known to speak version 1 cannot
	// be verified, but it is awaited: a machine that does not come back
	// at all is not dropped. Any heartbeat of the agent ends it, without
	// Recovered.
	if v := reset(t, e.db, a, time.Hour); v.Verified {
		t.Errorf("reset of a version 1 agent's machine said verifiable: %+v", v)
	}
	if _, err := pendingReset(t, e.db, a.machine); err != nil {
		t.Errorf("a reset of a version 1 agent's machine is not awaited: %v", err)
	}
	if status, resp := post(t, client, e.url, a.heartbeatV1(t, time.Now())); status != http.StatusNoContent {
		t.Errorf("version 1 heartbeat after the reset: %d %q", status, resp)
	}
	if _, err := pendingReset(t, e.db, a.machine); err == nil {
		t.Error("the version 1 agent's heartbeat left the reset pending")
	}
	if n := len(events(t, e.db, a.machine, bmdb.EventRecovered)); n != 0 {
		t.Errorf("%d Recovered from version 1 heartbeats", n)
	}
}

// resetAfterV2Heartbeat adds a machine whose agent sends a version 2
// heartbeat from source, then resets it (verify timeout an hour away):
// the reset is verifiable, with the boot identity before it.
func resetAfterV2Heartbeat(t *testing.T, source string) (*env, agent, *http.Client) {
	t.Helper()
	e, _ := bootEnv(t)
	a := e.addMachine(true)
	client := clientFrom(source)
	if status, body := post(t, client, e.url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("version 2 heartbeat: %d %q", status, body)
	}
	if v := reset(t, e.db, a, time.Hour); !v.Verified || v.BootBefore == uuid.Nil {
		t.Fatalf("reset of a version 2 agent's machine: %+v, want verifiable", v)
	}
	return e, a, client
}

// A heartbeat whose boot identity was forged (to pass the machine off as
// rebooted) or that is replayed is refused like any other forgery, and a
// version 2 heartbeat stripped down to version 1 does not verify either.
func TestForgedOrReplayedBootRefused(t *testing.T) {
	t.Parallel()
	e, a, client := resetAfterV2Heartbeat(t, "127.0.0.7")
	edit := func(body []byte, f func(map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	genuine := a.heartbeat(t, time.Now())
	forged := edit(genuine, func(m map[string]any) { m["boot_id"] = uuid.NewString() })
	if status, body := post(t, client, e.url, forged); status != http.StatusForbidden || !strings.HasPrefix(body, ResultBadSignature+":") {
		t.Errorf("forged boot_id: %d %q, want 403 bad_signature", status, body)
	}
	downgraded := edit(a.heartbeatIn(t, time.Now().Add(time.Millisecond), uuid.New()), func(m map[string]any) {
		m["version"] = 1
		delete(m, "boot_id")
		delete(m, "agent_digest")
	})
	if status, body := post(t, client, e.url, downgraded); status != http.StatusForbidden || !strings.HasPrefix(body, ResultBadSignature+":") {
		t.Errorf("version 2 stripped to version 1: %d %q, want 403 bad_signature", status, body)
	}
	// A genuine heartbeat of a new boot, captured and replayed after the
	// machine came back, changes nothing.
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	stranger := agent{a.machine, key}.heartbeatIn(t, time.Now().Add(2*time.Millisecond), uuid.New())
	if status, body := post(t, client, e.url, stranger); status != http.StatusForbidden {
		t.Errorf("another key's new boot: %d %q, want 403", status, body)
	}
	if n := len(events(t, e.db, a.machine, bmdb.EventRecovered)); n != 0 {
		t.Fatalf("%d Recovered after forgeries only", n)
	}
	back := a.heartbeatIn(t, time.Now().Add(3*time.Millisecond), uuid.New())
	if status, body := post(t, client, e.url, back); status != http.StatusNoContent {
		t.Fatalf("the genuine new boot: %d %q", status, body)
	}
	if status, body := post(t, client, e.url, back); status != http.StatusForbidden || !strings.HasPrefix(body, ResultReplay+":") {
		t.Errorf("replayed: %d %q, want 403 replay", status, body)
	}
	// Another replica: refused from the BMDB's timestamp.
	other := httptest.NewServer(New(e.db, Options{}).Handler())
	defer other.Close()
	if status, body := post(t, client, other.URL+Path, back); status != http.StatusForbidden || !strings.HasPrefix(body, ResultReplay+":") {
		t.Errorf("replayed to another replica: %d %q, want 403 replay", status, body)
	}
	if n := len(events(t, e.db, a.machine, bmdb.EventRecovered)); n != 1 {
		t.Errorf("%d Recovered, want 1", n)
	}
}

// A machine known to speak version 2 does not pass a reset by sending a
// genuine version 1 heartbeat (issue 54): it proves no reboot, so the
// reset stays pending, is NotRecovered at its verify timeout, and a
// heartbeat of a new boot still ends it as Recovered before then.
func TestVersion1AfterVersion2ProvesNothing(t *testing.T) {
	t.Parallel()
	e, a, client := resetAfterV2Heartbeat(t, "127.0.0.9")
	if status, resp := post(t, client, e.url, a.heartbeatV1(t, time.Now().Add(time.Millisecond))); status != http.StatusNoContent {
		t.Fatalf("version 1 heartbeat: %d %q, want 204 (the agent is alive)", status, resp)
	}
	if _, err := pendingReset(t, e.db, a.machine); err != nil {
		t.Fatalf("a version 1 heartbeat of a version 2 machine ended its reset: %v", err)
	}
	// Past the verify timeout: NotRecovered, once.
	if err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE machine_reset SET verify_by = now() - interval '1 second', reset_at = now() - interval '2 seconds' WHERE machine_id = $1`, a.machine)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var noted bool
	if err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		_, noted, err = tx.NoteNotRecovered(ctx, a.machine)
		return err
	}); err != nil || !noted {
		t.Fatalf("NoteNotRecovered after a version 1 heartbeat: %v, %v; want NotRecovered", noted, err)
	}
	if n := len(events(t, e.db, a.machine, bmdb.EventNotRecovered)); n != 1 {
		t.Errorf("%d NotRecovered, want 1", n)
	}
	if n := len(events(t, e.db, a.machine, bmdb.EventRecovered)); n != 0 {
		t.Errorf("%d Recovered from a version 1 heartbeat", n)
	}
}
