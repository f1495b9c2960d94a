package heartbeat

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

type env struct {
	t       *testing.T
	db      *bmdb.DB
	srv     *Server
	metrics *Metrics
	url     string
}

func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	reg := prometheus.NewRegistry()
	opts.Metrics = NewMetrics(reg)
	srv := New(db, opts)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &env{t: t, db: db, srv: srv, metrics: opts.Metrics, url: ts.URL + Path}
}

// agent is a machine with a recorded agent key.
type agent struct {
	machine uuid.UUID
	key     ed25519.PrivateKey
}

func (e *env) addMachine(withAgent bool) agent {
	e.t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		e.t.Fatal(err)
	}
	var id uuid.UUID
	err = e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		id, err = tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: uuid.NewString()})
		if err != nil || !withAgent {
			return err
		}
		return tx.SetAgentStarted(ctx, id, pub)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return agent{machine: id, key: key}
}

// lastHeartbeat returns the machine's heartbeat time, zero if none.
func (e *env) lastHeartbeat(machine uuid.UUID) time.Time {
	e.t.Helper()
	return bmdbtest.LastHeartbeat(e.t, e.db, machine)
}

// heartbeat is a version 2 heartbeat of a at ts, in the machine's first
// boot (firstBoot).
func (a agent) heartbeat(t testing.TB, ts time.Time) []byte {
	t.Helper()
	return a.heartbeatIn(t, ts, firstBoot(a.machine))
}

// firstBoot is the boot identity a test machine runs in until a test says
// otherwise.
func firstBoot(machine uuid.UUID) uuid.UUID {
	return uuid.NewSHA1(uuid.NameSpaceOID, machine[:])
}

// heartbeatIn is a version 2 heartbeat of a at ts in boot.
func (a agent) heartbeatIn(t testing.TB, ts time.Time, boot uuid.UUID) []byte {
	t.Helper()
	h, err := agentproto.NewHeartbeat(a.machine, ts, boot, [agentproto.DigestSize]byte{1}, a.key)
	return encoded(t, h, err)
}

// heartbeatV1 is a version 1 heartbeat of a at ts: no boot identity.
func (a agent) heartbeatV1(t testing.TB, ts time.Time) []byte {
	t.Helper()
	h, err := agentproto.NewHeartbeatV1(a.machine, ts, a.key)
	return encoded(t, h, err)
}

// encoded is heartbeat h's body; err is the error of making h.
func encoded(t testing.TB, h agentproto.Heartbeat, err error) []byte {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	b, err := agentproto.EncodeHeartbeat(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func post(t testing.TB, client *http.Client, url string, body []byte) (int, string) {
	t.Helper()
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (e *env) count(result string) float64 {
	var m dto.Metric
	if err := e.metrics.heartbeats.WithLabelValues(result).Write(&m); err != nil {
		e.t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestMetricsStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// Gather sorts the families by name.
	if len(families) != 3 || families[0].GetName() != "shepherd_heartbeat_connections_evicted_total" ||
		families[1].GetName() != "shepherd_heartbeat_connections_refused_total" || families[2].GetName() != "shepherd_heartbeats_total" {
		t.Fatalf("registered %v", families)
	}
	if n := len(families[2].GetMetric()); n != len(Results) {
		t.Fatalf("%d series, want one per result (%d)", n, len(Results))
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("%s %v starts at %v", f.GetName(), m.GetLabel(), v)
			}
		}
	}
}

func TestAccepted(t *testing.T) {
	e := newEnv(t, Options{})
	a := e.addMachine(true)
	if got := e.lastHeartbeat(a.machine); !got.IsZero() {
		t.Fatalf("heartbeat before any was sent: %s", got)
	}
	status, body := post(t, http.DefaultClient, e.url, a.heartbeat(t, time.Now()))
	if status != http.StatusNoContent {
		t.Fatalf("status %d %q", status, body)
	}
	first := e.lastHeartbeat(a.machine)
	if first.IsZero() {
		t.Fatal("accepted heartbeat not recorded")
	}
	time.Sleep(10 * time.Millisecond)
	if status, body := post(t, http.DefaultClient, e.url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("second heartbeat: %d %q", status, body)
	}
	if second := e.lastHeartbeat(a.machine); !second.After(first) {
		t.Fatalf("second heartbeat did not move the time: %s then %s", first, second)
	}
	if got := e.count(ResultAccepted); got != 2 {
		t.Errorf("accepted = %v, want 2", got)
	}
}

// TestRefused sends each kind of bad heartbeat for a machine that has a
// heartbeat already and checks that it is refused with the right status and
// result and changes nothing in machine_agent_heartbeat.
func TestRefused(t *testing.T) {
	e := newEnv(t, Options{MaxClockSkew: 30 * time.Second})
	a := e.addMachine(true)
	other := e.addMachine(true)    // another machine with an agent
	noAgent := e.addMachine(false) // provided, agent never started
	stranger := e.addMachine(true) // its key signs for a
	stranger.machine = uuid.New()  // ...and for a machine that does not exist
	_, wrongKey, _ := ed25519.GenerateKey(rand.Reader)

	replayed := a.heartbeat(t, time.Now())
	if status, body := post(t, http.DefaultClient, e.url, replayed); status != http.StatusNoContent {
		t.Fatalf("setup heartbeat: %d %q", status, body)
	}
	if status, body := post(t, http.DefaultClient, e.url, other.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("setup heartbeat: %d %q", status, body)
	}
	before := map[uuid.UUID]time.Time{a.machine: e.lastHeartbeat(a.machine), other.machine: e.lastHeartbeat(other.machine)}
	time.Sleep(10 * time.Millisecond) // so that a wrongly recorded heartbeat would show

	valid := a.heartbeat(t, time.Now())
	// Serve (fasthttp) and Handler (net/http) answer alike.
	urls := []struct{ transport, url string }{{"Handler", e.url}, {"Serve", "http://" + serve(t, e.srv) + Path}}
	for _, u := range urls {
		resp, err := http.Get(strings.TrimSuffix(u.url, Path) + "/elsewhere")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: another path answered %d, want 404", u.transport, resp.StatusCode)
		}
	}
	for _, tc := range []struct {
		name   string
		method string
		body   []byte
		status int
		result string
	}{
		{"wrong key", "POST", agent{a.machine, wrongKey}.heartbeat(t, time.Now()), 403, ResultBadSignature},
		{"wrong machine id", "POST", agent{other.machine, a.key}.heartbeat(t, time.Now()), 403, ResultBadSignature},
		{"unknown machine", "POST", stranger.heartbeat(t, time.Now()), 403, ResultUnknownMachine},
		{"no agent started", "POST", agent{noAgent.machine, a.key}.heartbeat(t, time.Now()), 403, ResultUnknownMachine},
		{"replayed", "POST", replayed, 403, ResultReplay},
		{"older than last", "POST", a.heartbeat(t, time.Now().Add(-5*time.Second)), 403, ResultReplay},
		{"stale", "POST", a.heartbeat(t, time.Now().Add(-time.Minute)), 403, ResultStale},
		{"future", "POST", a.heartbeat(t, time.Now().Add(time.Minute)), 403, ResultStale},
		{"truncated", "POST", valid[:len(valid)/2], 400, ResultBadRequest},
		{"not json", "POST", []byte("hello"), 400, ResultBadRequest},
		{"empty", "POST", nil, 400, ResultBadRequest},
		{"extra field", "POST", bytes.Replace(valid, []byte(`{`), []byte(`{"extra":1,`), 1), 400, ResultBadRequest},
		{"version 3", "POST", bytes.Replace(valid, []byte(`"version":2`), []byte(`"version":3`), 1), 400, ResultBadRequest},
		{"too large", "POST", append(append([]byte(nil), valid...), bytes.Repeat([]byte(" "), 2*agentproto.MaxHeartbeatSize)...), 413, ResultBadRequest},
		{"GET", "GET", nil, 405, ResultBadRequest},
	} {
		for _, u := range urls {
			t.Run(u.transport+"/"+tc.name, func(t *testing.T) {
				n := e.count(tc.result)
				req, err := http.NewRequest(tc.method, u.url, bytes.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				reason, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.status || !strings.HasPrefix(string(reason), tc.result+":") {
					t.Errorf("got %d %q, want %d %s", resp.StatusCode, reason, tc.status, tc.result)
				}
				if ct, nosniff := resp.Header.Get("Content-Type"), resp.Header.Get("X-Content-Type-Options"); ct != "text/plain; charset=utf-8" || nosniff != "nosniff" {
					t.Errorf("Content-Type %q, X-Content-Type-Options %q", ct, nosniff)
				}
				if allow := resp.Header.Get("Allow"); (tc.status == 405) != (allow == "POST") {
					t.Errorf("status %d with Allow %q", resp.StatusCode, allow)
				}
				if resp.Header.Get("Date") == "" {
					t.Error("no Date header")
				}
				if got := e.count(tc.result); got != n+1 {
					t.Errorf("%s counter went from %v to %v", tc.result, n, got)
				}
				for m, at := range before {
					if got := e.lastHeartbeat(m); !got.Equal(at) {
						t.Errorf("heartbeat of %s changed from %s to %s", m, at, got)
					}
				}
				if got := e.lastHeartbeat(noAgent.machine); !got.IsZero() {
					t.Errorf("machine without agent got a heartbeat at %s", got)
				}
				if got := e.lastHeartbeat(stranger.machine); !got.IsZero() {
					t.Errorf("unknown machine got a heartbeat at %s", got)
				}
			})
		}
	}
	// The machine's own agent is still welcome, by either.
	for _, u := range urls {
		if status, body := post(t, http.DefaultClient, u.url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
			t.Fatalf("%s: good heartbeat after the bad ones: %d %q", u.transport, status, body)
		}
	}
}

// TestAgentReplaced covers the key cache: a restarted agent's new key is
// picked up at once, and the replaced agent's heartbeats stop counting,
// whether the cache still holds its key or not.
func TestAgentReplaced(t *testing.T) {
	e := newEnv(t, Options{KeyRefetchInterval: time.Millisecond})
	old := e.addMachine(true)
	if status, body := post(t, http.DefaultClient, e.url, old.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("%d %q", status, body)
	}
	// AgentStart restarts the agent, which answers with a new key.
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, old.machine, pub)
	})
	if err != nil {
		t.Fatal(err)
	}
	// The old agent's key is still cached: the write refuses it.
	if status, body := post(t, http.DefaultClient, e.url, old.heartbeat(t, time.Now())); status != http.StatusForbidden {
		t.Fatalf("old agent after replacement: %d %q", status, body)
	}
	if got := e.lastHeartbeat(old.machine); !got.IsZero() {
		t.Fatalf("replaced agent's heartbeat recorded at %s", got)
	}
	time.Sleep(5 * time.Millisecond)
	replacement := agent{old.machine, key}
	if status, body := post(t, http.DefaultClient, e.url, replacement.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("new agent: %d %q", status, body)
	}
	if e.lastHeartbeat(old.machine).IsZero() {
		t.Fatal("new agent's heartbeat not recorded")
	}

	// Recovery deletes the tags while the key is cached.
	err = e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.DeleteAgentTags(ctx, old.machine)
	})
	if err != nil {
		t.Fatal(err)
	}
	if status, body := post(t, http.DefaultClient, e.url, replacement.heartbeat(t, time.Now())); status != http.StatusForbidden {
		t.Fatalf("heartbeat after the tags were deleted: %d %q", status, body)
	}
	if got := e.lastHeartbeat(old.machine); !got.IsZero() {
		t.Fatalf("heartbeat recorded after the tags were deleted, at %s", got)
	}
}

// TestConcurrentAgents has many agents heartbeat at once, twice each, so
// that the recorder batches them (including two heartbeats of one machine
// in one batch): every heartbeat is accepted or, for a machine's two
// racing heartbeats, at most one refused as a replay.
func TestConcurrentAgents(t *testing.T) {
	e := newEnv(t, Options{SourceRate: 1e6, SourceBurst: 1e6})
	const n = 60
	agents := make([]agent, n)
	for i := range agents {
		agents[i] = e.addMachine(true)
	}
	var wg sync.WaitGroup
	var accepted, replays atomic.Int64
	start := make(chan struct{})
	for _, a := range agents {
		for k := range 2 {
			body := a.heartbeat(t, time.Now().Add(time.Duration(k)*time.Millisecond))
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				status, reason := post(t, http.DefaultClient, e.url, body)
				switch {
				case status == http.StatusNoContent:
					accepted.Add(1)
				case strings.HasPrefix(reason, ResultReplay):
					replays.Add(1)
				default:
					t.Errorf("%d %q", status, reason)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	if accepted.Load() < n || accepted.Load()+replays.Load() != 2*n {
		t.Errorf("accepted %d, replays %d of %d", accepted.Load(), replays.Load(), 2*n)
	}
	writes := e.srv.recorder.writes.Load()
	t.Logf("%d heartbeats accepted in %d writes", accepted.Load(), writes)
	if writes >= accepted.Load() {
		t.Errorf("%d writes for %d heartbeats: no batching", writes, accepted.Load())
	}
	for _, a := range agents {
		if e.lastHeartbeat(a.machine).IsZero() {
			t.Errorf("machine %s has no heartbeat", a.machine)
		}
	}
}

// TestRecorderKeys records heartbeats of one machine under its agent's key
// and under another, concurrently, so that both land in one batch: each is
// reported for its own key.
func TestRecorderKeys(t *testing.T) {
	e := newEnv(t, Options{})
	a := e.addMachine(true)
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	good := bmdb.AgentKey{Machine: a.machine, PublicKey: a.key.Public().(ed25519.PublicKey)}
	bad := bmdb.AgentKey{Machine: a.machine, PublicKey: other}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agent := good
			if i%2 == 1 {
				agent = bad
			}
			recorded, _, err := e.srv.recorder.record(agent)
			if err != nil || recorded != (i%2 == 0) {
				t.Errorf("heartbeat %d: recorded %v, %v", i, recorded, err)
			}
		}()
	}
	wg.Wait()
	t.Logf("40 heartbeats in %d writes", e.srv.recorder.writes.Load())
}

// clientFrom returns an HTTP client whose connections come from ip, so that
// the server sees distinct sources on one host (all of 127.0.0.0/8 is
// loopback on Linux).
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 16},
	}
}

// TestFloodDoesNotStarveAgents floods the endpoint with bad requests from
// one address (malformed bodies, forgeries for the good agent's machine,
// heartbeats for unknown machines) and with forgeries and unknown machines
// from sixteen more, while a good agent on another address heartbeats every
// 100 ms: every one of its heartbeats must be accepted.
func TestFloodDoesNotStarveAgents(t *testing.T) {
	e := newEnv(t, Options{})
	good := e.addMachine(true)
	_, forger, _ := ed25519.GenerateKey(rand.Reader)
	goodClient := clientFrom("127.0.0.2")
	if status, body := post(t, goodClient, e.url, good.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("first heartbeat: %d %q", status, body)
	}

	ctx, stop := context.WithCancel(context.Background())
	var flooders sync.WaitGroup
	var sent atomic.Int64
	flood := func(client *http.Client, bodies func(i int) []byte) {
		defer flooders.Done()
		for i := 0; ctx.Err() == nil; i++ {
			req, _ := http.NewRequestWithContext(ctx, "POST", e.url, bytes.NewReader(bodies(i)))
			resp, err := client.Do(req)
			if err != nil {
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			sent.Add(1)
		}
	}
	mixed := func(i int) []byte {
		switch i % 4 {
		case 0:
			return []byte(`{"version":1,"machine_id":`)
		case 1:
			return agent{good.machine, forger}.heartbeat(t, time.Now())
		case 2:
			return agent{uuid.New(), forger}.heartbeat(t, time.Now())
		default:
			return bytes.Repeat([]byte("x"), 4096)
		}
	}
	main := clientFrom("127.0.0.1")
	for range 8 {
		flooders.Add(1)
		go flood(main, mixed)
	}
	for i := range 16 {
		flooders.Add(1)
		go flood(clientFrom(fmt.Sprintf("127.0.1.%d", i+1)), func(i int) []byte {
			if i%2 == 0 {
				return agent{good.machine, forger}.heartbeat(t, time.Now())
			}
			return agent{uuid.New(), forger}.heartbeat(t, time.Now())
		})
	}

	var slowest time.Duration
	const beats = 30
	for i := range beats {
		time.Sleep(100 * time.Millisecond)
		t0 := time.Now()
		status, body := post(t, goodClient, e.url, good.heartbeat(t, time.Now()))
		slowest = max(slowest, time.Since(t0))
		if status != http.StatusNoContent {
			t.Errorf("good heartbeat %d refused during the flood: %d %q", i, status, body)
		}
		if age := time.Since(e.lastHeartbeat(good.machine)); age > time.Second {
			t.Errorf("good agent's heartbeat is %s old during the flood", age)
		}
	}
	stop()
	flooders.Wait()
	t.Logf("flood: %d requests (rate_limited %v, bad_request %v, bad_signature %v, unknown_machine %v); good agent: %d accepted, slowest %s",
		sent.Load(), e.count(ResultRateLimited), e.count(ResultBadRequest), e.count(ResultBadSignature), e.count(ResultUnknownMachine),
		int(e.count(ResultAccepted)), slowest)
	if e.count(ResultRateLimited) == 0 {
		t.Error("the flood was never rate limited")
	}
	if got := e.count(ResultAccepted); got != beats+1 {
		t.Errorf("accepted %v heartbeats, want %d", got, beats+1)
	}
}

func TestRemoteIPKey(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.1:1234":              "192.0.2.1",
		"[::ffff:192.0.2.1]:1234":     "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:1234": "2001:db8:1:2::/64",
		"[2001:db8:1:2::9]:99":        "2001:db8:1:2::/64",
		"[fe80::1%eth0]:99":           "fe80::/64",
		"@":                           "@",
	} {
		if got := RemoteIPKey(&http.Request{RemoteAddr: addr}); got != want {
			t.Errorf("RemoteIPKey(%q) = %q, want %q", addr, got, want)
		}
	}
}

func TestSourceLimitersBounded(t *testing.T) {
	l := newSourceLimiters(1, 2, 100)
	now := time.Now()
	for i := range 1000 {
		l.take(fmt.Sprint(i), now)
		if len(l.sources) > 100 {
			t.Fatalf("%d sources kept, limit 100", len(l.sources))
		}
	}
	// Three calls in a row, each taking a token: the third finds none.
	if first, second, third := l.take("a", now), l.take("a", now), l.take("a", now); !first || !second || third {
		t.Error("burst of 2 not enforced")
	}
	// A refund gives one back, and no more than the burst.
	l.refund("a", now)
	if !l.take("a", now) || l.take("a", now) {
		t.Error("a refund did not give back exactly one token")
	}
	if !l.take("a", now.Add(time.Second)) {
		t.Error("bucket did not refill")
	}
	for range 5 {
		l.refund("a", now.Add(time.Second))
	}
	if first, second, third := l.take("a", now.Add(time.Second)), l.take("a", now.Add(time.Second)), l.take("a", now.Add(time.Second)); !first || !second || third {
		t.Error("refunds filled the bucket beyond its burst")
	}
}

// TestServe runs the endpoint over TLS through Serve and stops it.
func TestServe(t *testing.T) {
	e := newEnv(t, Options{})
	a := e.addMachine(true)
	ts, ln, certFile, keyFile := tlsListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(ctx, ln, certFile, keyFile) }()
	client := ts.Client()
	url := "https://" + ln.Addr().String() + Path
	if status, body := post(t, client, url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("%d %q", status, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := e.srv.Serve(context.Background(), ln, certFile, ""); err == nil {
		t.Error("Serve accepted a certificate without a key")
	}
}

// tlsListener returns a listener on a free local port, a certificate
// and key (in files) for Serve to answer on it with, and a stopped
// httptest server whose Client trusts that certificate.
func tlsListener(t *testing.T) (ts *httptest.Server, ln net.Listener, certFile, keyFile string) {
	t.Helper()
	ts = httptest.NewUnstartedServer(nil)
	ts.StartTLS() // only for its certificate
	ts.Close()
	certFile, keyFile = writeCert(t, ts.TLS.Certificates[0])
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ts, ln, certFile, keyFile
}

func writeCert(t *testing.T, cert tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	var certPEM []byte
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// A panic while handling a request (here in the caller's SourceKey) fails
// that request, not the process: fasthttp, unlike net/http, does not
// recover a handler's panic, so Serve does.
func TestServeSurvivesAPanic(t *testing.T) {
	e := newEnv(t, Options{SourceKey: func(r *http.Request) string {
		if r.Header.Get("X-Panic") != "" {
			panic("a source key function's bug")
		}
		return RemoteIPKey(r)
	}})
	a := e.addMachine(true)
	url := "http://" + serve(t, e.srv) + Path
	req, err := http.NewRequest("POST", url, bytes.NewReader(a.heartbeat(t, time.Now())))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Panic", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("panicking request answered %d, want 500", resp.StatusCode)
	}
	if status, body := post(t, http.DefaultClient, url, a.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("next heartbeat: %d %q", status, body)
	}
}
