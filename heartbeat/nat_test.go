package heartbeat

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// A thousand healthy agents behind one source address (a NAT, a load
// balancer that source-NATs) are all accepted, twice over: accepted
// heartbeats keep their source's tokens. Lookups that find no agent spend
// that address's bucket, and then only what needs a lookup is refused: the
// agents' heartbeats are still accepted, and forgeries checked against a
// cached key get their own refusal.
func TestManyAgentsBehindOneAddress(t *testing.T) {
	t.Parallel()
	// No re-read of a key after a failed signature becomes due during the
	// test, however slowly it runs: a re-read is a lookup, which the spent
	// address could not pay for.
	e := newEnv(t, Options{KeyRefetchInterval: time.Hour})
	agents := e.addAgents(1000)
	client := clientFrom("127.0.0.3")
	for round := range 2 {
		accepted := sendRound(t, client, e.url, agents, func(agent) time.Duration { return 0 }, 16)
		if refused := len(agents) - countTrue(accepted); refused > 0 {
			t.Errorf("round %d: %d heartbeats refused", round, refused)
		}
	}
	if got := e.count(ResultAccepted); got != 2000 {
		t.Errorf("%g accepted, want 2000", got)
	}
	if got := e.count(ResultRateLimited); got != 0 {
		t.Errorf("%g rate limited, want 0", got)
	}

	// Heartbeats of unknown machines from the same address spend its
	// bucket (burst 40).
	_, forger, _ := ed25519.GenerateKey(rand.Reader)
	limited := false
	for range 100 {
		status, _ := post(t, client, e.url, agent{uuid.New(), forger}.heartbeat(t, time.Now()))
		if status == http.StatusTooManyRequests {
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("100 heartbeats of unknown machines from one address were never rate limited")
	}
	// The spent address's agents are still accepted, and a forgery for a
	// machine whose key is cached is refused for what it is.
	if status, body := post(t, client, e.url, agents[0].heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Errorf("healthy agent behind a spent address: %d %q", status, body)
	}
	forged := agent{machine: agents[0].machine, key: agents[1].key}
	if status, body := post(t, client, e.url, forged.heartbeat(t, time.Now())); status != http.StatusForbidden {
		t.Errorf("forgery from a spent address: %d %q, want 403 bad_signature", status, body)
	}
}

// TestNoisyNeighbourBehindOneAddress has a thousand healthy agents behind
// one address heartbeat at a compressed interval beside a noisy neighbour
// behind the same address: a sender of garbage at 100 requests/s (mostly
// heartbeats of unknown machines, which spend the address's bucket, and
// malformed bodies, forgeries and stale heartbeats), or 150 more agents
// whose clocks are 2 minutes off. At least 99 % of the healthy agents'
// heartbeats must be accepted, and every agent must have most of its
// heartbeats accepted. What is counted is acceptances, not latencies: a
// slow machine makes the rounds longer, not the test fail.
func TestNoisyNeighbourBehindOneAddress(t *testing.T) {
	const (
		healthy = 1000
		rounds  = 8
	)
	for _, tc := range []struct {
		name string
		// skewed agents are sent in every round beside the healthy ones;
		// garbage runs beside the rounds.
		skewed  int
		garbage bool
	}{
		{name: "garbage sender", garbage: true},
		{name: "skewed clocks", skewed: 150},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			agents := e.addAgents(healthy + tc.skewed)
			skewed := make(map[uuid.UUID]bool, tc.skewed)
			for _, a := range agents[healthy:] {
				skewed[a.machine] = true
			}
			skew := func(a agent) time.Duration {
				if skewed[a.machine] {
					return 2 * time.Minute
				}
				return 0
			}
			// One client, whose keep-alive connections the 64 workers of
			// a round share, stands for the agents' address.
			client := clientFrom("127.0.0.3")
			client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
			// The agents were running before the neighbour turned noisy:
			// their keys are cached. (A key lookup from a spent address
			// is refused; see Options.SourceRate.)
			if ok := countTrue(sendRound(t, client, e.url, agents[:healthy], skew, 16)); ok != healthy {
				t.Fatalf("warm-up: %d of %d accepted", ok, healthy)
			}

			ctx, stop := context.WithCancel(context.Background())
			var noise sync.WaitGroup
			var garbageSent atomic.Int64
			if tc.garbage {
				// Spend the address's bucket first, so that the whole
				// run is measured with it empty.
				_, forger, _ := ed25519.GenerateKey(rand.Reader)
				for range 100 {
					post(t, client, e.url, agent{uuid.New(), forger}.heartbeat(t, time.Now()))
				}
				if e.count(ResultRateLimited) == 0 {
					t.Fatal("100 heartbeats of unknown machines did not spend the bucket")
				}
				// Four senders at 25 requests/s each.
				for g := range 4 {
					noise.Add(1)
					go func() {
						defer noise.Done()
						garbageClient := clientFrom("127.0.0.3")
						tick := time.NewTicker(40 * time.Millisecond)
						defer tick.Stop()
						for i := g; ; i += 4 {
							select {
							case <-ctx.Done():
								return
							case <-tick.C:
							}
							var body []byte
							switch i % 8 {
							case 0:
								body = []byte(`{"version":1,"machine_id":`)
							case 1:
								body = agent{agents[i%healthy].machine, forger}.heartbeat(t, time.Now())
							case 2:
								body = agents[(i+1)%healthy].heartbeat(t, time.Now().Add(-2*time.Minute))
							default:
								body = agent{uuid.New(), forger}.heartbeat(t, time.Now())
							}
							req, _ := http.NewRequestWithContext(ctx, "POST", e.url, bytes.NewReader(body))
							if resp, err := garbageClient.Do(req); err == nil {
								io.Copy(io.Discard, resp.Body)
								resp.Body.Close()
								garbageSent.Add(1)
							}
						}
					}()
				}
			}

			// The agents heartbeat every 500 ms instead of every 5 s.
			perAgent := make([]int, len(agents))
			start := time.Now()
			for r := range rounds {
				roundStart := time.Now()
				for i, ok := range sendRound(t, client, e.url, agents, skew, 64) {
					if ok {
						perAgent[i]++
					}
				}
				if r < rounds-1 {
					time.Sleep(time.Until(roundStart.Add(500 * time.Millisecond)))
				}
			}
			elapsed := time.Since(start)
			stop()
			noise.Wait()

			total, least := 0, rounds
			for _, n := range perAgent[:healthy] {
				total += n
				least = min(least, n)
			}
			for i, n := range perAgent[healthy:] {
				if n != 0 {
					t.Errorf("skewed agent %d: %d heartbeats accepted", i, n)
				}
			}
			t.Logf("%d rounds in %s: %d of %d healthy heartbeats accepted, fewest of one agent %d; garbage sent %d (%.0f/s); results: rate_limited %g, unknown_machine %g, bad_signature %g, bad_request %g, stale %g, error %g",
				rounds, elapsed.Round(time.Millisecond), total, healthy*rounds, least, garbageSent.Load(), float64(garbageSent.Load())/elapsed.Seconds(),
				e.count(ResultRateLimited), e.count(ResultUnknownMachine), e.count(ResultBadSignature), e.count(ResultBadRequest), e.count(ResultStale), e.count(ResultError))
			if total*100 < healthy*rounds*99 {
				t.Errorf("%d of %d healthy heartbeats accepted, want at least 99 %%", total, healthy*rounds)
			}
			if least < rounds/2 {
				t.Errorf("an agent had only %d of its %d heartbeats accepted", least, rounds)
			}
			if tc.skewed > 0 && e.count(ResultStale) < float64(tc.skewed*rounds) {
				t.Errorf("%g stale refusals, want %d", e.count(ResultStale), tc.skewed*rounds)
			}
		})
	}
}

// TestConcurrentLookupsWithinBudget sends heartbeats that each need a key
// lookup and find no valid key (unknown machines, and forgeries for a
// known machine whose key may be re-read every millisecond) from one
// address, 64 at a time: the lookups the BMDB sees stay within the
// address's budget, burst plus rate times the time taken, because a
// request takes its token before its lookup.
func TestConcurrentLookupsWithinBudget(t *testing.T) {
	e := newEnv(t, Options{KeyRefetchInterval: time.Millisecond})
	known := e.addMachine(true)
	if status, body := post(t, http.DefaultClient, e.url, known.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Fatalf("%d %q", status, body)
	}
	lookupsBefore := e.srv.keys.lookups.Load()
	_, forger, _ := ed25519.GenerateKey(rand.Reader)
	client := clientFrom("127.0.0.6")
	var wg sync.WaitGroup
	var sent atomic.Int64
	start := time.Now()
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				machine := uuid.New()
				if (w+i)%2 == 0 {
					machine = known.machine
				}
				post(t, client, e.url, agent{machine, forger}.heartbeat(t, time.Now()))
				sent.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	lookups := e.srv.keys.lookups.Load() - lookupsBefore
	budget := 40 + int64(20*elapsed.Seconds()) + 1
	t.Logf("%d requests in %s: %d key lookups (budget %d), rate_limited %g, unknown_machine %g, bad_signature %g",
		sent.Load(), elapsed.Round(time.Millisecond), lookups, budget, e.count(ResultRateLimited), e.count(ResultUnknownMachine), e.count(ResultBadSignature))
	if lookups > budget {
		t.Errorf("%d key lookups from one address in %s, budget %d", lookups, elapsed, budget)
	}
	if e.count(ResultRateLimited) == 0 {
		t.Error("never rate limited")
	}
	// The agent is still accepted from that address.
	if status, body := post(t, client, e.url, known.heartbeat(t, time.Now())); status != http.StatusNoContent {
		t.Errorf("the machine's agent after the forgeries: %d %q", status, body)
	}
}

// addAgents adds n machines with recorded agents, in one transaction.
func (e *env) addAgents(n int) []agent {
	e.t.Helper()
	agents := make([]agent, n)
	pubs := make([]ed25519.PublicKey, n)
	for i := range agents {
		pub, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			e.t.Fatal(err)
		}
		agents[i].key, pubs[i] = key, pub
	}
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		for i := range agents {
			id, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: uuid.NewString()})
			if err != nil {
				return err
			}
			if err := tx.SetAgentStarted(ctx, id, pubs[i]); err != nil {
				return err
			}
			agents[i].machine = id
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return agents
}

// sendRound sends a heartbeat of each agent, its clock off by skew(a),
// from client through workers concurrent requests, and reports which
// were accepted.
func sendRound(t *testing.T, client *http.Client, url string, agents []agent, skew func(agent) time.Duration, workers int) []bool {
	t.Helper()
	accepted := make([]bool, len(agents))
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				// Not post: a failed request is a heartbeat not accepted,
				// and t.Fatal must not run outside the test's goroutine.
				resp, err := client.Post(url, "application/json", bytes.NewReader(agents[i].heartbeat(t, time.Now().Add(skew(agents[i])))))
				if err != nil {
					t.Logf("agent %d: %v", i, err)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				accepted[i] = resp.StatusCode == http.StatusNoContent
			}
		}()
	}
	for i := range agents {
		work <- i
	}
	close(work)
	wg.Wait()
	return accepted
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// rawConn is a client connection that sends requests by hand, so that the
// test sees exactly which connection the server serves, refuses or closes.
type rawConn struct {
	net.Conn
	r *bufio.Reader
}

func dialFrom(t *testing.T, ip, addr string) *rawConn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{Conn: c, r: bufio.NewReader(c)}
}

// heartbeat sends body as a heartbeat and returns the response's status,
// or the error of reading it (within wait).
func (c *rawConn) heartbeat(body []byte, wait time.Duration) (int, error) {
	c.SetDeadline(time.Now().Add(wait))
	defer c.SetDeadline(time.Time{})
	_, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: shepherd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", Path, len(body), body)
	if err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// closedByServer reports whether the server closed c within wait (a read
// returns EOF or a reset rather than timing out).
func (c *rawConn) closedByServer(wait time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(wait))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.r.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// serve runs srv through Serve on a loopback port until the test ends.
func serve(t *testing.T, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, "", "") }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// TestConnectionLimits checks Serve's bounds on connections: at
// MaxConnsPerSource, a new connection of the address closes the address's
// least recently used idle one (counted as evicted), and is closed at once
// (counted as refused) only when every connection of the address carries a
// request, while another address is still served; the same at MaxConns in
// total; a keep-alive connection left idle is closed after IdleTimeout.
func TestConnectionLimits(t *testing.T) {
	e := newEnv(t, Options{})
	a := e.addMachine(true)
	const wait = 10 * time.Second // only ever waited for in full on failure
	served := func(t *testing.T, c *rawConn) {
		t.Helper()
		if status, err := c.heartbeat(a.heartbeat(t, time.Now()), wait); status != http.StatusNoContent {
			t.Fatalf("%d, %v", status, err)
		}
	}
	counted := func(t *testing.T, c prometheus.Counter, before, want float64, what string) {
		t.Helper()
		if got := counterValue(t, c) - before; got != want {
			t.Errorf("%g connections counted as %s, want %g", got, what, want)
		}
	}

	for _, tc := range []struct {
		name string
		opts Options
		// from names the source of each connection: the first three fill
		// the limit, the fourth goes beyond it.
		from [4]string
	}{
		{"per source", Options{MaxConnsPerSource: 3, MaxConns: 100}, [4]string{"127.0.0.7", "127.0.0.7", "127.0.0.7", "127.0.0.7"}},
		{"total", Options{MaxConns: 3}, [4]string{"127.0.0.9", "127.0.0.10", "127.0.0.11", "127.0.0.12"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Metrics = e.metrics
			srv := New(e.db, tc.opts)
			addr := serve(t, srv)
			// idleNow waits until the server has seen the connections
			// it answered go idle: the client reads a response before
			// the server marks its connection so.
			idleNow := func(want map[string]int) {
				t.Helper()
				deadline := time.Now().Add(wait)
				for {
					ok := true
					for source, n := range want {
						ok = ok && srv.conns.Load().Counts(source).Evictable == n
					}
					if ok {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("the server did not see %v connections go idle", want)
					}
					time.Sleep(time.Millisecond)
				}
			}
			sources := func(conns int) map[string]int {
				m := map[string]int{}
				for _, ip := range tc.from[:conns] {
					m[ip]++
				}
				return m
			}
			evicted, refused := counterValue(t, e.metrics.connsEvicted), counterValue(t, e.metrics.connsRefused)

			// Three idle keep-alive connections fill the limit: a fourth
			// is served, and the least recently used idle one closed.
			var idle []*rawConn
			// The server marks a connection idle after the client has
			// read its response: on a loaded machine one connection's
			// mark could come after the next one's, changing which is
			// the least recently used. Each is waited for.
			for i := range 3 {
				c := dialFrom(t, tc.from[i], addr)
				served(t, c)
				idle = append(idle, c)
				idleNow(sources(i + 1))
			}
			served(t, idle[0]) // now the second is the least recently used
			idleNow(sources(3))
			served(t, dialFrom(t, tc.from[3], addr))
			if !idle[1].closedByServer(wait) {
				t.Fatal("the least recently used idle connection was not closed to admit a new one")
			}
			counted(t, e.metrics.connsEvicted, evicted, 1, "evicted")
			served(t, idle[0])
			idle3 := sources(3)
			if tc.name == "total" {
				idle3 = map[string]int{tc.from[0]: 1, tc.from[2]: 1, tc.from[3]: 1}
			}
			idleNow(idle3)

			// Three connections each carrying a request (whose body the
			// handler waits for: it has asked for it with 100 Continue)
			// close the three idle ones and fill the limit: a fourth is
			// closed at once, however often it is tried, and nothing more
			// is evicted.
			for i := range 3 {
				c := dialFrom(t, tc.from[i], addr)
				c.SetDeadline(time.Now().Add(wait))
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: shepherd\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n", Path)
				resp, err := http.ReadResponse(c.r, nil)
				if err != nil || resp.StatusCode != http.StatusContinue {
					t.Fatalf("request %d: %v, %v", i, resp, err)
				}
			}
			counted(t, e.metrics.connsEvicted, evicted, 4, "evicted")
			evicted = counterValue(t, e.metrics.connsEvicted)
			for i := range 5 {
				c := dialFrom(t, tc.from[3], addr)
				if status, err := c.heartbeat(a.heartbeat(t, time.Now()), wait); err == nil {
					t.Fatalf("extra connection %d answered %d", i, status)
				} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatalf("extra connection %d neither answered nor closed: %v", i, err)
				}
			}
			counted(t, e.metrics.connsRefused, refused, 5, "refused")
			counted(t, e.metrics.connsEvicted, evicted, 0, "evicted")
			if tc.name == "per source" {
				// Another address is served.
				served(t, dialFrom(t, "127.0.0.8", addr))
			}
		})
	}

	t.Run("one per source", func(t *testing.T) {
		// The victim is the source's last connection: its entry must
		// survive for the new one.
		srv := New(e.db, Options{Metrics: e.metrics, MaxConnsPerSource: 1})
		addr := serve(t, srv)
		idleNow := func(n int) {
			t.Helper()
			deadline := time.Now().Add(wait)
			for srv.conns.Load().Counts("127.0.0.13").Evictable != n {
				if time.Now().After(deadline) {
					t.Fatalf("the server did not see %d idle connections", n)
				}
				time.Sleep(time.Millisecond)
			}
		}
		first := dialFrom(t, "127.0.0.13", addr)
		served(t, first)
		idleNow(1)
		second := dialFrom(t, "127.0.0.13", addr)
		served(t, second)
		if !first.closedByServer(wait) {
			t.Fatal("the idle connection was not closed for a new one")
		}
		idleNow(1)
		second.Close()
		idleNow(0)
		served(t, dialFrom(t, "127.0.0.13", addr))
		idleNow(1)
		served(t, dialFrom(t, "127.0.0.13", addr))
	})

	t.Run("idle", func(t *testing.T) {
		srv := New(e.db, Options{Metrics: e.metrics, IdleTimeout: 100 * time.Millisecond})
		addr := serve(t, srv)
		c := dialFrom(t, "127.0.0.12", addr)
		if status, err := c.heartbeat(a.heartbeat(t, time.Now()), wait); status != http.StatusNoContent {
			t.Fatalf("%d, %v", status, err)
		}
		// Well before the server's other timeouts (5 s for a request's
		// headers, 10 s for a request): only IdleTimeout closes it.
		if !c.closedByServer(4 * time.Second) {
			t.Error("idle connection still open 4 s after its last request, IdleTimeout 100ms")
		}
	})

	t.Run("defaults", func(t *testing.T) {
		o := Options{}.withDefaults()
		if o.MaxConns != 2048 || o.MaxConnsPerSource != 1024 || o.IdleTimeout != 15*time.Second {
			t.Errorf("defaults: MaxConns %d, MaxConnsPerSource %d, IdleTimeout %s", o.MaxConns, o.MaxConnsPerSource, o.IdleTimeout)
		}
	})
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
