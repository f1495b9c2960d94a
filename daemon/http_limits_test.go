package daemon

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

	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
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
				time.Sleep(time.Second)
			}
		}()
	}
	defer func() {
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
