package shepherdcli

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/connlimit/connlimittest"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// The -listen server is bounded against clients that trickle headers,
// send huge ones or hold hundreds of idle connections; it stays responsive
// and its memory does not grow with them. /status requires the token of
// -status_token_file; /metrics and the probes stay open.
func TestHTTPServerLimitsAndStatusToken(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := replicatest.Start(t, shepherdBinary, "daemon", replicatest.EnvWithoutDSN(envDSN+"="+dsn), "-listen=127.0.0.1:0", "-sim_machines=5", "-status_token_file="+token)
	bmdbtest.WaitFor(t, 60*time.Second, "the daemon to be ready", func() (bool, string) {
		code, body, err := d.Get("/readyz")
		return err == nil && code == 200, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
	})
	addr := d.HTTPAddr()
	do := func(path string, auth func(*http.Request)) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if auth != nil {
			auth(req)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path string
		auth func(*http.Request)
		want int
	}{
		{"/status", nil, http.StatusUnauthorized},
		{"/status", func(r *http.Request) { r.Header.Set("Authorization", "Bearer wrong") }, http.StatusUnauthorized},
		{"/status", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret-token") }, http.StatusOK},
		{"/status", func(r *http.Request) { r.SetBasicAuth("operator", "s3cret-token") }, http.StatusOK},
		{"/status/machine/not-a-uuid", nil, http.StatusUnauthorized},
		{"/metrics", nil, http.StatusOK},
		{"/healthz", nil, http.StatusOK},
	} {
		if code := do(tc.path, tc.auth); code != tc.want {
			t.Errorf("GET %s: %d, want %d", tc.path, code, tc.want)
		}
	}

	// Headers over the limit are refused.
	big := strings.Repeat("x", 64<<10)
	if code := do("/healthz", func(r *http.Request) { r.Header.Set("X-Big", big) }); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("64 KiB of headers: %d, want 431", code)
	}

	pid := d.PID()
	before := procStatus(t, pid, "VmRSS")
	// 300 clients open connections and trickle a header, a byte a second.
	var conns []net.Conn
	stop := make(chan struct{})
	for range 300 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		go func() {
			for i := 0; ; i++ {
				if _, err := c.Write([]byte{"GET / HTTP/1.1\r\nX: "[i%20]}); err != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
			}
		}()
	}
	defer func() {
		close(stop)
		for _, c := range conns {
			c.Close()
		}
	}()
	// The server drops them once their header time is up...
	dropped := make(chan struct{}, len(conns))
	for _, c := range conns {
		go func() {
			io.Copy(io.Discard, bufio.NewReader(c))
			dropped <- struct{}{}
		}()
	}
	deadline := time.After(30 * time.Second)
	for n := 0; n < len(conns); n++ {
		select {
		case <-dropped:
		case <-deadline:
			t.Fatalf("%d of %d trickling connections still open after 30 s", len(conns)-n, len(conns))
		}
	}
	// ... and answers again.
	bmdbtest.WaitFor(t, 30*time.Second, "the server to answer after the trickle", func() (bool, string) {
		code, _, err := d.Get("/healthz")
		return err == nil && code == 200, fmt.Sprintf("/healthz: %d %v", code, err)
	})
	if grew := procStatus(t, pid, "VmRSS") - before; grew > 64<<20 {
		t.Errorf("RSS grew by %d MiB under 300 trickling connections", grew>>20)
	}
}

// A status token file that others may read, or that is missing or empty,
// is refused at start with exit 2.
func TestStatusTokenFileRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	empty := filepath.Join(dir, "empty")
	os.WriteFile(open, []byte("token"), 0o644)
	os.WriteFile(empty, []byte("\n"), 0o600)
	for file, want := range map[string]string{
		open:                          "accessible by others",
		empty:                         "is empty",
		filepath.Join(dir, "missing"): "no such file",
		dir:                           "not a regular file",
	} {
		code, _, out := runShepherd(t, replicatest.EnvWithoutDSN(), "-bmdb_dsn=postgres://u@127.0.0.1:1/nowhere", "-status_token_file="+file)
		if code != exitUsage || !strings.Contains(out, want) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("-status_token_file %s: exit %d %q, want 2 and one line with %q", file, code, out, want)
		}
	}
}

// sourceConnLimit is the connections of one source the -listen server
// keeps (package daemon's httpConnLimits).
const sourceConnLimit = 64

// Hundreds of idle keep-alive connections from one source (and hundreds
// more, silent, from another) do not keep /healthz and /readyz from being
// answered, from the same source or a third: one source holds at most 64
// connections, and the least recently used idle one is closed to make
// room for a new one.
func TestProbesAnswerThroughIdleKeepAlives(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	d := replicatest.Start(t, shepherdBinary, "daemon", replicatest.EnvWithoutDSN(envDSN+"="+dsn), "-listen=127.0.0.1:0", "-sim_machines=5")
	bmdbtest.WaitFor(t, 60*time.Second, "the daemon to be ready", func() (bool, string) {
		code, body, err := d.Get("/readyz")
		return err == nil && code == 200, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
	})
	addr := d.HTTPAddr()

	const n = 300
	var idle, silent []net.Conn
	defer func() {
		for _, c := range append(idle, silent...) {
			c.Close()
		}
	}()
	for range n {
		idle = append(idle, connlimittest.KeepAlive(t, addr, net.IPv4(127, 0, 0, 1)))
	}
	other := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for range n {
		c, err := other.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}

	// The probes, each on a new connection as the kubelet makes them,
	// from the idle connections' source and from another: answered. The
	// deadline is generous: the point is that they are answered at all
	// (they used to wait in the backlog until the kubelet gave up).
	for _, from := range []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(127, 0, 0, 3)} {
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: from}}).DialContext,
			DisableKeepAlives: true,
		}}
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := client.Get("http://" + addr + path)
			if err != nil {
				t.Errorf("GET %s from %s beside %d idle keep-alives: %v", path, from, n, err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			// /readyz may say not ready (a database ping slower than 1 s on
			// a loaded machine); it answers either way.
			if resp.StatusCode != http.StatusOK && (path == "/healthz" || resp.StatusCode != http.StatusInternalServerError) {
				t.Errorf("GET %s from %s: %d %q", path, from, resp.StatusCode, body)
			}
		}
	}

	// Every close the limits made is done before it is counted: waiting
	// for the count makes the closes visible to ClosedByServer however
	// loaded the machine is.
	bmdbtest.WaitFor(t, 30*time.Second, "the server to close the idle connections beyond the source's limit", func() (bool, string) {
		m, _ := d.Metrics()
		got := m.Value("shepherd_http_connections_limited_total", "action", "closed_idle")
		return got >= n-float64(sourceConnLimit), fmt.Sprintf("closed_idle = %g", got)
	})
	// The server counts a close after its close(2), but the client's
	// socket learns of it when the kernel delivers the loopback FIN, which
	// on a loaded machine (the CI, with the race detector) can take longer
	// than one look's 200 ms: look again until it has.
	var closed, open int
	bmdbtest.WaitFor(t, 30*time.Second, fmt.Sprintf("at most %d idle connections of one source open", sourceConnLimit), func() (bool, string) {
		closed, open = connlimittest.ClosedByServer(idle, time.Now().Add(200*time.Millisecond))
		return open <= sourceConnLimit, fmt.Sprintf("%d open, %d closed by the server", open, closed)
	})
	t.Logf("of %d idle keep-alive connections from one source, %d open, %d closed by the server", n, open, closed)
	m, _ := d.Metrics()
	if got := m.Value("shepherd_http_connections_limited_total", "action", "closed_idle"); got < n-float64(sourceConnLimit) {
		t.Errorf("shepherd_http_connections_limited_total{action=\"closed_idle\"} = %g, want at least %d", got, n-sourceConnLimit)
	}
	if got := m.Value("shepherd_http_connections_limited_total", "action", "refused"); got == 0 {
		t.Errorf("shepherd_http_connections_limited_total{action=\"refused\"} = 0: the silent connections beyond one source's limit were not refused")
	}
}
