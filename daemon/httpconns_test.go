package daemon

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/connlimit/connlimittest"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/connlimit"
)

// limitedServer serves /healthz and /metrics on a limiting listener with
// limits, with header timeouts long enough that no connection of the test
// expires by itself.
func limitedServer(t *testing.T, limits connlimit.Limits) (*connlimit.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := newLimitListener(ln, limits, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "metrics") })
	srv := &http.Server{
		Handler:           probeOnlyGuard(mux),
		ReadHeaderTimeout: 5 * time.Minute,
		ConnState:         connlimit.StateHook(ll, http.StateActive, http.StateIdle),
		ConnContext:       connContext,
	}
	go srv.Serve(ll)
	t.Cleanup(func() { srv.Close() })
	return ll, ln.Addr().String()
}

// waitIdle waits until n connections of l carry no request.
func waitIdle(t *testing.T, l *connlimit.Listener, n int) {
	t.Helper()
	bmdbtest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d idle connections", n), func() (bool, string) {
		c := l.Counts("")
		return c.Evictable == n, fmt.Sprintf("%d idle", c.Evictable)
	})
}

// waitCounts waits until l has all connections, reserved of them
// probe-only.
func waitCounts(t *testing.T, l *connlimit.Listener, all, reserved int) {
	t.Helper()
	bmdbtest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d connections, %d probe-only", all, reserved), func() (bool, string) {
		c := l.Counts("")
		return c.Open == all && c.ProbeOnly == reserved, fmt.Sprintf("%d connections, %d probe-only", c.Open, c.ProbeOnly)
	})
}

// busy opens a connection from 127.0.0.last that starts a request and
// never ends its headers: a request in progress, not idle.
func busy(t *testing.T, addr string, last byte) net.Conn {
	t.Helper()
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, last)}}).Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A connection the server refuses may be closed before this is sent.
	io.WriteString(c, "GET /metrics HTTP/1.1\r\n")
	return c
}

// refused reports whether the server closed c without an answer.
func refused(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := c.Read(make([]byte, 1))
	return n == 0 && err != nil && !os.IsTimeout(err)
}

// getFrom requests path on a new connection from 127.0.0.last.
func getFrom(addr string, last byte, path string) (*http.Response, string, error) {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, last)}}).DialContext,
		DisableKeepAlives: true,
	}}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

// When every slot holds a request in progress, a probe still gets one of
// the reserved slots, which serve /healthz and /readyz only, one request
// each; a source may hold few of them, and none beyond the reserve.
func TestConnLimitsReserveSlotsForProbes(t *testing.T) {
	t.Parallel()
	ll, addr := limitedServer(t, connlimit.Limits{Total: 4, PerSource: 2, ProbeReserve: 2, ProbeReservePerSource: 1})
	// Every slot busy: two sources with two requests in progress each.
	for _, src := range []byte{2, 2, 3, 3} {
		busy(t, addr, src)
	}
	waitCounts(t, ll, 4, 0)
	waitIdle(t, ll, 0) // each carries its request: none may be closed

	// A probe from a source at its limit, and from another: answered, and
	// the connection closed after it.
	for _, src := range []byte{2, 4} {
		resp, body, err := getFrom(addr, src, "/healthz")
		if err != nil || resp.StatusCode != http.StatusOK || !resp.Close {
			t.Errorf("/healthz from 127.0.0.%d with every slot busy: %v %v %q (closed after: %v)", src, err, resp, body, resp != nil && resp.Close)
		}
		waitCounts(t, ll, 4, 0) // the reserved slot free again
	}
	// Anything else on a reserved slot: 503.
	if resp, body, err := getFrom(addr, 4, "/metrics"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/metrics on a reserved slot: %v %v %q, want 503", err, resp, body)
	}
	waitCounts(t, ll, 4, 0)

	// The reserve is bounded per source and in all.
	busy(t, addr, 5)
	waitCounts(t, ll, 5, 1)
	if c := busy(t, addr, 5); !refused(c) {
		t.Errorf("a second reserved slot for one source was not refused")
	}
	busy(t, addr, 6)
	waitCounts(t, ll, 6, 2)
	if c := busy(t, addr, 7); !refused(c) {
		t.Errorf("a connection beyond the reserve was not refused")
	}
	if _, _, err := getFrom(addr, 8, "/healthz"); err == nil {
		t.Errorf("a probe beyond the reserve was answered")
	}
}

// A source at its limit whose connections are idle keep-alives gets its
// new connection by closing its least recently used idle one; other
// sources' connections are left alone.
func TestConnLimitsCloseIdleForNew(t *testing.T) {
	t.Parallel()
	ll, addr := limitedServer(t, connlimit.Limits{Total: 4, PerSource: 2, ProbeReserve: 2, ProbeReservePerSource: 1})
	// Each made idle before the next, which orders them.
	other := connlimittest.KeepAlive(t, addr, net.IPv4(127, 0, 0, 3))
	waitIdle(t, ll, 1)
	first := connlimittest.KeepAlive(t, addr, net.IPv4(127, 0, 0, 2))
	waitIdle(t, ll, 2)
	second := connlimittest.KeepAlive(t, addr, net.IPv4(127, 0, 0, 2))
	waitIdle(t, ll, 3)
	defer func() {
		for _, c := range []net.Conn{other, first, second} {
			c.Close()
		}
	}()
	third := connlimittest.KeepAlive(t, addr, net.IPv4(127, 0, 0, 2))
	defer third.Close()
	if !refused(first) {
		t.Errorf("the source's least recently used idle connection was not closed")
	}
	waitCounts(t, ll, 3, 0)
	if closed, _ := connlimittest.ClosedByServer([]net.Conn{other, second}, time.Now().Add(200*time.Millisecond)); closed != 0 {
		t.Errorf("%d connections closed besides the least recently used one", closed)
	}
	// The whole server full of idle connections: a new source's connection
	// closes the least recently used of them.
	fourth := connlimittest.KeepAlive(t, addr, net.IPv4(127, 0, 0, 4))
	defer fourth.Close()
	waitCounts(t, ll, 4, 0)
	waitIdle(t, ll, 4)
	fifth := connlimittest.KeepAlive(t, addr, net.IPv4(127, 0, 0, 5))
	defer fifth.Close()
	if !refused(other) {
		t.Errorf("the server's least recently used idle connection was not closed")
	}
	waitCounts(t, ll, 4, 0)
}
