package statuspage

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/statuspage/statuspagetest"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

var (
	// The two shipped processes, as their packages declare them.
	processes = []Process{
		{Info: controlloop.Info{Process: agentstart.Process, Label: "agentstart"}, Candidates: agentstart.Candidates(), Explain: agentstart.Definition().Explain},
		{Info: controlloop.Info{Process: recovery.Process, Label: "recovery"}, Candidates: recovery.Candidates(30*time.Minute, 10*time.Minute), Explain: recovery.Definition().Explain},
	}
)

func get(t *testing.T, srv *httptest.Server, path string) (int, http.Header, string) {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// The pages over plain HTTP: status codes, escaping, headers, read-only.
func TestPagesOverHTTP(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	srv := httptest.NewServer(New(f.DB, processes, Options{}))
	defer srv.Close()

	code, hdr, body := get(t, srv, "/status")
	if code != http.StatusOK {
		t.Fatalf("/status: %d\n%s", code, body)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q does not forbid external assets", csp)
	}
	for _, want := range []string{
		`<meta name="viewport"`,
		"agentstart", "ShepherdRecovery", "paused by operator", "incident 1234: BMC firmware rollout",
		"ssh: handshake failed: &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; more",
		`href="/status/machine/` + f.Failed.String() + `"`,
		`href="/status/machine/` + f.Leased.String() + `"`, // oldest leases
		"ShepherdInstall", "not ours", // another daemon's paused process
		"shepherd-agentstart", // the session
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
	// One script: the refresh, inline, allowed by its hash and nothing else.
	if n := strings.Count(body, "<script"); n != 1 || !strings.Contains(body, "<script>"+refreshScript+"</script>") {
		t.Errorf("/status has %d scripts, want only the inline refresh script", n)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src '"+refreshScriptHash+"'") || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("Content-Security-Policy %q does not allow exactly the refresh script", csp)
	}
	for _, asset := range []string{"<link", "<img", "src=", "@import", "url("} {
		if strings.Contains(body, asset) {
			t.Errorf("/status contains %q: the page must have no external assets", asset)
		}
	}
	// Totals: 8 machines, one agent started (it never heartbeated:
	// stale), 7 never started.
	for _, want := range []string{
		`<b>8</b><span>machines</span>`, `<b class="ok">0</b><span>agents healthy</span>`,
		`<b class="warn">1</b><span>agents stale</span>`, `<b>7</b><span>never started</span>`,
		"heartbeated in the last 10m0s", // Recovery's heartbeat_timeout
		`<tr class="recovered">`, `<span class="badge ok">recovered</span>`, statuspagetest.RecoveredCause,
		`<tr class="failed">`,
		`<span class="pid">rack1-`, // provider ids beside UUIDs
		`data-points="12"`,         // the sparklines
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
	quietSrv := httptest.NewServer(New(f.DB, processes, Options{Refresh: -1}))
	defer quietSrv.Close()
	_, _, quiet := get(t, quietSrv, "/status")
	if strings.Contains(quiet, "<script") || strings.Contains(quiet, `id="refresh"`) {
		t.Errorf("with refresh off, the page still has the refresh script or control")
	}

	code, _, body = get(t, srv, MachinePath(f.Failed))
	if code != http.StatusOK {
		t.Fatalf("machine page: %d\n%s", code, body)
	}
	for _, want := range []string{f.Failed.String(), "rack1-", "192.0.2.", "dc1/rack1", "Failed", "Retried", "BMC reset by hand", "&lt;script&gt;"} {
		if !strings.Contains(body, want) {
			t.Errorf("machine page lacks %q", want)
		}
	}
	if code, _, body = get(t, srv, MachinePath(f.Finished)); code != http.StatusOK || !strings.Contains(body, "SHA256:") {
		t.Errorf("machine with an agent: %d, want its key fingerprint", code)
	}

	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{MachinePath(uuid.New()), http.StatusNotFound, "Unknown machine"},
		{"/status/machine/not-a-uuid", http.StatusBadRequest, "Not a machine ID"},
		{"/status/machine/?id=junk", http.StatusNotFound, "No machine matches"},
		{"/status/machine/?id=", http.StatusBadRequest, "Nothing to look up"},
		{"/status/machine/?id=" + f.Failed.String(), http.StatusSeeOther, ""},
		{"/status/machine/?id=rack1-03", http.StatusSeeOther, ""},
		{"/status/machine/?id=twin", http.StatusOK, "Machines named twin"},
		{"/status/", http.StatusMovedPermanently, ""},
		{"/status/nothing", http.StatusNotFound, "Not found"},
	} {
		code, _, body := get(t, srv, tc.path)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d, want %d with %q", tc.path, code, tc.code, tc.want)
		}
	}
	_, _, body = get(t, srv, "/status/machine/?id=twin")
	for _, id := range f.Twins {
		if !strings.Contains(body, `href="`+MachinePath(id)+`"`) {
			t.Errorf("the page of an ambiguous provider id does not link %s", id)
		}
	}
	resp, err := http.Post(srv.URL+"/status", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /status: %d, want 405", resp.StatusCode)
	}
}

// A machine that was deleted keeps its history, and its page says so.
func TestDeletedMachine(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	srv := httptest.NewServer(New(f.DB, processes, Options{}))
	defer srv.Close()
	// Deleting machines is a provider's business, which the BMDB API does
	// not offer yet: delete the row by hand.
	conn, err := pgx.Connect(context.Background(), f.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "DELETE FROM machines WHERE machine_id = $1", f.Finished); err != nil {
		t.Fatal(err)
	}
	code, _, body := get(t, srv, MachinePath(f.Finished))
	if code != http.StatusOK || !strings.Contains(body, "has been deleted") || !strings.Contains(body, "Finished") {
		t.Errorf("deleted machine: %d, want its history and a deleted banner\n%s", code, body)
	}
}

// A process its circuit breaker paused is shown as such, with the
// breaker's reason.
func TestBreakerPauseShown(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	srv := httptest.NewServer(New(f.DB, processes, Options{}))
	defer srv.Close()
	// The fleet's last two AgentStart attempts include a failure: a
	// window of two with a threshold of 0 trips.
	v, err := f.DB.CheckBreaker(context.Background(), agentstart.Process.Name, bmdb.Breaker{Window: 2, Threshold: 0})
	if err != nil || !v.Tripped {
		t.Fatalf("tripping the breaker: %+v, %v", v, err)
	}
	_, _, body := get(t, srv, "/status")
	for _, want := range []string{"paused by circuit breaker", "circuit breaker: ", "of the last 2 attempts failed", "shepherd resume ShepherdAgentStart"} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
}

// A binary of another name is named in the page's command hints, and the
// default page is unchanged by it (each handler has its own templates).
func TestProgramNamedInHints(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	if _, err := operator.New(f.DB).PauseProcess(context.Background(), agentstart.Process.Name, "test: hints"); err != nil {
		t.Fatal(err)
	}
	fleetd := httptest.NewServer(New(f.DB, processes, Options{Program: "fleetd"}))
	defer fleetd.Close()
	plain := httptest.NewServer(New(f.DB, processes, Options{}))
	defer plain.Close()
	_, _, body := get(t, fleetd, "/status")
	if !strings.Contains(body, "<code>fleetd resume ShepherdAgentStart -reason R</code>") || strings.Contains(body, "<code>shepherd ") {
		t.Errorf("fleetd's /status does not name fleetd in its hints")
	}
	_, _, body = get(t, fleetd, MachinePath(f.Failed))
	if !strings.Contains(body, "<code>fleetd explain ") || strings.Contains(body, "<code>shepherd ") {
		t.Errorf("fleetd's machine page does not name fleetd in its hints")
	}
	_, _, body = get(t, plain, "/status")
	if !strings.Contains(body, "<code>shepherd resume ShepherdAgentStart -reason R</code>") {
		t.Errorf("the default /status does not name shepherd in its hints")
	}
}

// The overview is read at most once per TTL, and a failed read is not
// cached.
func TestOverviewCache(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	hd := &handler{db: operator.New(f.DB), processes: processes, ttl: time.Hour}
	now := time.Unix(1_700_000_000, 0)
	hd.now = func() time.Time { return now }
	ctx := context.Background()
	first := hd.overview(ctx)
	if len(first.Errors) > 0 {
		t.Fatal(first.Errors)
	}
	if _, err := operator.New(f.DB).ResumeProcess(ctx, recovery.Process.Name); err != nil {
		t.Fatal(err)
	}
	if again := hd.overview(ctx); again != first {
		t.Errorf("a read within the TTL was not served from the cache")
	}
	now = now.Add(2 * time.Hour)
	fresh := hd.overview(ctx)
	if fresh == first || fresh.Processes[1].Pause != nil {
		t.Errorf("after the TTL the overview was not read again")
	}
}
