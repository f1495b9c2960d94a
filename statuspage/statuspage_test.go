package statuspage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

var (
	// The two shipped processes, as their packages declare them.
	processes = []Process{
		{Info: controlloop.Info{Process: agentstart.Process, Label: "agentstart"}, Candidates: bmdb.AgentStartCandidates()},
		{Info: controlloop.Info{Process: recovery.Process, Label: "recovery"}, Candidates: bmdb.RecoveryCandidates(30*time.Minute, 10*time.Minute)},
	}
)

// hostileCause is a failure cause as a broken machine might produce it: the
// page must show it as text, never as markup.
const hostileCause = `ssh: handshake failed: <script>alert("x")</script> & more`

// recoveredCause is the cause of a failure that a later Finish made good.
const recoveredCause = "BMC busy, try later"

// fleet is a test database with a small fleet in every state the page
// shows.
type fleet struct {
	dsn      string
	db       *bmdb.DB
	failed   uuid.UUID // AgentStart failed on it (hostileCause), then retried
	leased   uuid.UUID // AgentStart holds a lease on it
	finished uuid.UUID // AgentStart failed on it (recoveredCause), then finished: it has an agent
	// twins share provider id "twin" at two providers.
	twins   []uuid.UUID
	session *bmdb.Session
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		for i := range 6 {
			if _, err := tx.AddMachine(ctx, bmdb.Provided{
				Provider: "test", ProviderID: fmt.Sprintf("rack1-%02d", i), Address: fmt.Sprintf("192.0.2.%d", i+10), Location: "dc1/rack1",
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "shepherd-agentstart", Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	f := &fleet{dsn: dsn, db: db, session: s}

	w := f.claim(t)
	f.finished = w.Machine
	// A failure of this machine's lease that the Finish below makes good:
	// recorded as the lease's history would have it (the page only reads
	// history).
	if err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO work_history (machine_id, process, event, session_id, failed_cause) VALUES ($1, $2, 'Failed', $3, $4)`,
			w.Machine, agentstart.Process.Name, s.ID(), recoveredCause)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, w.Machine, []byte("agent-key"))
	}); err != nil {
		t.Fatal(err)
	}
	w = f.claim(t)
	f.failed = w.Machine
	if err := w.Fail(ctx, bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour}, hostileCause); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Retry(ctx, f.failed, agentstart.Process.Name, "BMC reset by hand"); err != nil {
		t.Fatal(err)
	}
	w = f.claim(t)
	if w.Machine == f.failed {
		// The retried machine may come back first; fail it again.
		if err := w.Fail(ctx, bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour}, hostileCause); err != nil {
			t.Fatal(err)
		}
		w = f.claim(t)
	}
	f.leased = w.Machine
	t.Cleanup(func() { w.Cancel(context.Background()) })

	if _, err := db.PauseProcess(ctx, recovery.Process.Name, "incident 1234: BMC firmware rollout"); err != nil {
		t.Fatal(err)
	}
	// Two machines that two providers both call "twin", added after the
	// claims so that none of them is leased.
	err = db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		f.twins = f.twins[:0]
		for _, provider := range []string{"redfish", "ipmi"} {
			id, err := tx.AddMachine(ctx, bmdb.Provided{Provider: provider, ProviderID: "twin"})
			if err != nil {
				return err
			}
			f.twins = append(f.twins, id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.PauseProcess(ctx, "ShepherdInstall", "not ours"); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fleet) claim(t *testing.T) *bmdb.Lease {
	t.Helper()
	w, err := f.session.Claim(context.Background(), agentstart.Process, bmdb.AgentStartCandidates())
	if err != nil {
		t.Fatalf("claiming: %v", err)
	}
	return w
}

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
	f := newFleet(t)
	srv := httptest.NewServer(New(f.db, processes, Options{}))
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
		`href="/status/machine/` + f.failed.String() + `"`,
		`href="/status/machine/` + f.leased.String() + `"`, // oldest leases
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
		`<tr class="recovered">`, `<span class="badge ok">recovered</span>`, recoveredCause,
		`<tr class="failed">`,
		`<span class="pid">rack1-`, // provider ids beside UUIDs
		`data-points="12"`,         // the sparklines
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
	quietSrv := httptest.NewServer(New(f.db, processes, Options{Refresh: -1}))
	defer quietSrv.Close()
	_, _, quiet := get(t, quietSrv, "/status")
	if strings.Contains(quiet, "<script") || strings.Contains(quiet, `id="refresh"`) {
		t.Errorf("with refresh off, the page still has the refresh script or control")
	}

	code, _, body = get(t, srv, MachinePath(f.failed))
	if code != http.StatusOK {
		t.Fatalf("machine page: %d\n%s", code, body)
	}
	for _, want := range []string{f.failed.String(), "rack1-", "192.0.2.", "dc1/rack1", "Failed", "Retried", "BMC reset by hand", "&lt;script&gt;"} {
		if !strings.Contains(body, want) {
			t.Errorf("machine page lacks %q", want)
		}
	}
	if code, _, body = get(t, srv, MachinePath(f.finished)); code != http.StatusOK || !strings.Contains(body, "SHA256:") {
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
		{"/status/machine/?id=" + f.failed.String(), http.StatusSeeOther, ""},
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
	for _, id := range f.twins {
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
	f := newFleet(t)
	srv := httptest.NewServer(New(f.db, processes, Options{}))
	defer srv.Close()
	// Deleting machines is a provider's business, which the BMDB API does
	// not offer yet: delete the row by hand.
	conn, err := pgx.Connect(context.Background(), f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "DELETE FROM machines WHERE machine_id = $1", f.finished); err != nil {
		t.Fatal(err)
	}
	code, _, body := get(t, srv, MachinePath(f.finished))
	if code != http.StatusOK || !strings.Contains(body, "has been deleted") || !strings.Contains(body, "Finished") {
		t.Errorf("deleted machine: %d, want its history and a deleted banner\n%s", code, body)
	}
}

// A process its circuit breaker paused is shown as such, with the
// breaker's reason.
func TestBreakerPauseShown(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	srv := httptest.NewServer(New(f.db, processes, Options{}))
	defer srv.Close()
	// The fleet's last two AgentStart attempts include a failure: a
	// window of two with a threshold of 0 trips.
	v, err := f.db.CheckBreaker(context.Background(), agentstart.Process.Name, bmdb.Breaker{Window: 2, Threshold: 0})
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
	f := newFleet(t)
	if _, err := f.db.PauseProcess(context.Background(), agentstart.Process.Name, "test: hints"); err != nil {
		t.Fatal(err)
	}
	fleetd := httptest.NewServer(New(f.db, processes, Options{Program: "fleetd"}))
	defer fleetd.Close()
	plain := httptest.NewServer(New(f.db, processes, Options{}))
	defer plain.Close()
	_, _, body := get(t, fleetd, "/status")
	if !strings.Contains(body, "<code>fleetd resume ShepherdAgentStart</code>") || strings.Contains(body, "<code>shepherd ") {
		t.Errorf("fleetd's /status does not name fleetd in its hints")
	}
	_, _, body = get(t, fleetd, MachinePath(f.failed))
	if !strings.Contains(body, "<code>fleetd explain ") || strings.Contains(body, "<code>shepherd ") {
		t.Errorf("fleetd's machine page does not name fleetd in its hints")
	}
	_, _, body = get(t, plain, "/status")
	if !strings.Contains(body, "<code>shepherd resume ShepherdAgentStart</code>") {
		t.Errorf("the default /status does not name shepherd in its hints")
	}
}

// The overview is read at most once per TTL, and a failed read is not
// cached.
func TestOverviewCache(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	hd := &handler{db: f.db, processes: processes, ttl: time.Hour}
	now := time.Unix(1_700_000_000, 0)
	hd.now = func() time.Time { return now }
	ctx := context.Background()
	first := hd.overview(ctx)
	if len(first.Errors) > 0 {
		t.Fatal(first.Errors)
	}
	if _, err := f.db.ResumeProcess(ctx, recovery.Process.Name); err != nil {
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

// outputDir is where the browser test leaves its screenshots:
// $TEST_OUTPUT_DIR/statuspage when set (CI collects it), else the test's
// artifact directory (kept with go test -artifacts).
func outputDir(t *testing.T) string {
	if dir := os.Getenv("TEST_OUTPUT_DIR"); dir != "" {
		dir = filepath.Join(dir, "statuspage")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.ArtifactDir()
}

// browser starts a headless Chromium for t. It fails, naming the Debian
// package, when there is none: a skipped browser test checks nothing.
func browser(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatalf("chromium not found on PATH: install the Debian package \"chromium\" (apt-get install -y chromium)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		// Root in a container has no user namespace sandbox to give.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	// Start the browser now, so that a broken installation fails here. The
	// first call's context must carry no deadline: it would end the browser.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// step bounds one browser step.
func step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 30*time.Second)
}

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := step(ctx)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func run[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	sctx, cancel := step(ctx)
	defer cancel()
	v, err := chromedp.Run(sctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// In a real browser: load the overview, follow a failure to its machine,
// check what a person would read, look at it on a phone, and keep
// screenshots.
func TestInChromium(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	srv := httptest.NewServer(New(f.db, processes, Options{}))
	defer srv.Close()
	// The same pages, refreshing every second, for the refresh check.
	liveSrv := httptest.NewServer(New(f.db, processes, Options{Refresh: time.Second}))
	defer liveSrv.Close()
	out := outputDir(t)
	ctx := browser(t)
	start := time.Now()

	// Every request the pages make must go to the daemon itself.
	var mu sync.Mutex
	var requests, foreign []string
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("enabling network events: %v", err)
	}
	err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok && e.Request != nil {
			mu.Lock()
			requests = append(requests, e.Request.URL)
			if !strings.HasPrefix(e.Request.URL, srv.URL) && !strings.HasPrefix(e.Request.URL, liveSrv.URL) {
				foreign = append(foreign, e.Request.URL)
			}
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}

	do(t, ctx, "loading /status",
		chromedp.Navigate(srv.URL+"/status"),
		chromedp.WaitVisible(chromedp.CSS("#process-agentstart")))
	overviewText := run(t, ctx, "reading /status", chromedp.Text(chromedp.CSS("body")))
	failureCause := run(t, ctx, "reading a failure", chromedp.Text(chromedp.CSS("#process-agentstart table.failures td.cause")))
	save(t, out, "overview.png", run(t, ctx, "screenshot", chromedp.FullScreenshot(100)))
	for _, want := range []string{"Fleet status", "agentstart", "recovery", "paused by operator", "incident 1234: BMC firmware rollout",
		"running", "failed, last hour", "Most recent failures", "Oldest leases", "Sessions", "live", "ShepherdInstall"} {
		// innerText applies the headings' text-transform.
		if !strings.Contains(strings.ToLower(overviewText), strings.ToLower(want)) {
			t.Errorf("the overview does not show %q", want)
		}
	}
	if failureCause != hostileCause {
		t.Errorf("the failure cause reads %q, want the literal text %q", failureCause, hostileCause)
	}
	totals := run(t, ctx, "reading the totals", chromedp.Text(chromedp.CSS("#totals")))
	for _, want := range []string{"8\nmachines", "0\nagents healthy", "1\nagents stale", "7\nnever started"} {
		if !strings.Contains(totals, want) {
			t.Errorf("the fleet totals do not read %q: %q", want, totals)
		}
	}
	recovered := run(t, ctx, "reading the recovered failure", chromedp.Text(chromedp.CSS("#process-agentstart tr.recovered")))
	if !strings.Contains(recovered, "recovered") || !strings.Contains(recovered, recoveredCause) {
		t.Errorf("the failure that a Finish made good reads %q, want it marked recovered", recovered)
	}
	recoveredColour := run(t, ctx, "reading the recovered failure's colour", chromedp.Evaluate[string](
		`getComputedStyle(document.querySelector('#process-agentstart tr.recovered td.cause .muted')).color`))
	failedColour := run(t, ctx, "reading the failure's colour", chromedp.Evaluate[string](
		`getComputedStyle(document.querySelector('#process-agentstart tr.failed td.cause')).color`))
	if recoveredColour == failedColour {
		t.Errorf("a recovered failure is shown in the failures' colour (%s)", failedColour)
	}
	spark := run(t, ctx, "reading the sparkline", chromedp.Evaluate[[]int](
		`(function () { var s = document.querySelector('#process-agentstart svg.spark');
		   if (!s) return [];
		   return [Number(s.getAttribute('data-points')), s.querySelectorAll('polyline').length,
		           s.querySelector('polyline.started').getAttribute('points').split(' ').length,
		           Math.round(s.getBoundingClientRect().width)]; })()`))
	if len(spark) != 4 || spark[0] != 12 || spark[1] != 2 || spark[2] != 12 || spark[3] == 0 {
		t.Errorf("the sparkline (points, lines, points drawn, width) is %v, want 12 points, 2 lines, 12 points, drawn", spark)
	}
	pids := run(t, ctx, "reading the provider ids", chromedp.Text(chromedp.CSS("#process-agentstart table.failures .pid")))
	if !strings.HasPrefix(pids, "rack1-") {
		t.Errorf("the failures do not name their machine's provider id: %q", pids)
	}

	// Follow the most recent failure to its machine, as an operator would.
	do(t, ctx, "following a failure to its machine",
		chromedp.Click(chromedp.CSS("#process-agentstart table.failures a"), chromedp.NodeVisible),
		chromedp.WaitVisible(chromedp.CSS("table.history")))
	location := run(t, ctx, "reading the location", chromedp.Location())
	machineText := run(t, ctx, "reading the machine page", chromedp.Text(chromedp.CSS("body")))
	save(t, out, "machine.png", run(t, ctx, "screenshot", chromedp.FullScreenshot(100)))
	if want := srv.URL + MachinePath(f.failed); location != want {
		t.Errorf("the failure link led to %s, want %s", location, want)
	}
	for _, want := range []string{f.failed.String(), "Tags", "dc1/rack1", "192.0.2.", "Failed", hostileCause,
		"Retried", "BMC reset by hand", "Started", "ShepherdAgentStart", "shepherd backoff clear"} {
		if !strings.Contains(machineText, want) {
			t.Errorf("the machine page does not show %q", want)
		}
	}

	// The lookup form of the overview leads to the same page.
	do(t, ctx, "looking a machine up",
		chromedp.Navigate(srv.URL+"/status"),
		chromedp.SendKeys(chromedp.CSS("form.lookup input"), f.leased.String()),
		chromedp.Submit(chromedp.CSS("form.lookup")),
		chromedp.WaitVisible(chromedp.CSS("table.history")))
	if loc := run(t, ctx, "reading the location", chromedp.Location()); loc != srv.URL+MachinePath(f.leased) {
		t.Errorf("the lookup form led to %s", loc)
	}

	// The search takes provider ids too: one match opens the machine, an
	// id that two providers use lists both, an unknown one says so.
	names, err := f.db.ProviderIDs(context.Background(), []uuid.UUID{f.failed})
	if err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "searching a provider id",
		chromedp.Navigate(srv.URL+"/status"),
		chromedp.SetValue(chromedp.CSS("form.lookup input"), names[f.failed]),
		chromedp.Submit(chromedp.CSS("form.lookup")),
		chromedp.WaitVisible(chromedp.CSS("table.history")))
	if loc := run(t, ctx, "reading the location", chromedp.Location()); loc != srv.URL+MachinePath(f.failed) {
		t.Errorf("searching %s led to %s, want its machine's page", names[f.failed], loc)
	}
	do(t, ctx, "searching an ambiguous provider id",
		chromedp.Navigate(srv.URL+"/status"),
		chromedp.SetValue(chromedp.CSS("form.lookup input"), "twin"),
		chromedp.Submit(chromedp.CSS("form.lookup")),
		chromedp.WaitVisible(chromedp.CSS("table.matches")))
	if n := run(t, ctx, "counting the matches", chromedp.Evaluate[int](`document.querySelectorAll('table.matches tbody tr').length`)); n != 2 {
		t.Errorf("the ambiguous search lists %d machines, want 2", n)
	}
	save(t, out, "search-ambiguous.png", run(t, ctx, "screenshot", chromedp.FullScreenshot(100)))
	do(t, ctx, "searching an unknown provider id",
		chromedp.Navigate(srv.URL+"/status"),
		chromedp.SetValue(chromedp.CSS("form.lookup input"), "rack9-99"),
		chromedp.Submit(chromedp.CSS("form.lookup")),
		chromedp.WaitVisible(chromedp.CSS("section.error")))
	if text := run(t, ctx, "reading the answer", chromedp.Text(chromedp.CSS("body"))); !strings.Contains(text, "No machine matches") {
		t.Errorf("an unknown provider id got %q", text)
	}

	// On a phone: nothing wider than the screen, so nothing to scroll
	// sideways but the tables' own scrollers.
	const wider = `document.documentElement.scrollWidth > window.innerWidth + 1`
	do(t, ctx, "loading /status on a phone-sized screen",
		chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile),
		chromedp.Navigate(srv.URL+"/status"),
		chromedp.WaitVisible(chromedp.CSS("#process-agentstart")))
	if run(t, ctx, "measuring", chromedp.Evaluate[bool](wider)) {
		t.Errorf("on a 390px-wide screen the overview is wider than the screen")
	}
	save(t, out, "overview-phone.png", run(t, ctx, "screenshot", chromedp.FullScreenshot(100)))
	do(t, ctx, "loading a machine on a phone-sized screen",
		chromedp.Navigate(srv.URL+MachinePath(f.failed)),
		chromedp.WaitVisible(chromedp.CSS("table.history")))
	if run(t, ctx, "measuring", chromedp.Evaluate[bool](wider)) {
		t.Errorf("on a 390px-wide screen the machine page is wider than the screen")
	}
	save(t, out, "machine-phone.png", run(t, ctx, "screenshot", chromedp.FullScreenshot(100)))

	// Left open, the overview refreshes itself in place: a change in the
	// BMDB shows up with no navigation (a marker set on the page survives).
	// The heading is read in one script: a refresh may swap it between a
	// query and a read.
	const recoveryHeading = `document.querySelector('#process-recovery h2').textContent`
	do(t, ctx, "loading a self-refreshing /status",
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(liveSrv.URL+"/status"),
		chromedp.WaitVisible(chromedp.CSS("#autorefresh")))
	run(t, ctx, "marking the page", chromedp.Evaluate[bool](`window.stillTheSamePage = true`))
	if !strings.Contains(run(t, ctx, "reading Recovery", chromedp.Evaluate[string](recoveryHeading)), "paused") {
		t.Fatalf("Recovery is not shown paused before the change")
	}
	if _, err := f.db.ResumeProcess(context.Background(), recovery.Process.Name); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		heading := run(t, ctx, "reading Recovery", chromedp.Evaluate[string](recoveryHeading))
		if strings.Contains(heading, "running") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the open page did not show Recovery resumed within 20 s: %q", heading)
		}
		run(t, ctx, "waiting for a refresh", chromedp.Poll[bool](`document.getElementById('refreshed').textContent !== ''`, chromedp.WithPollingTimeout(5*time.Second)))
	}
	if !run(t, ctx, "checking the marker", chromedp.Evaluate[bool](`window.stillTheSamePage === true`)) {
		t.Errorf("the page was reloaded instead of refreshed in place")
	}
	if note := run(t, ctx, "reading the refresh note", chromedp.Text(chromedp.CSS("#refreshed"))); !strings.HasPrefix(note, "updated ") {
		t.Errorf("the refresh note reads %q", note)
	}
	save(t, out, "overview-refreshed.png", run(t, ctx, "screenshot", chromedp.FullScreenshot(100)))

	mu.Lock()
	defer mu.Unlock()
	if len(requests) == 0 {
		t.Errorf("saw no request at all: the network listener is broken, so the next check proves nothing")
	}
	if len(foreign) > 0 {
		t.Errorf("the pages requested other origins: %v", foreign)
	}
	t.Logf("browser checks took %s (%d requests); screenshots in %s", time.Since(start).Round(time.Millisecond), len(requests), out)
}

func save(t *testing.T, dir, name string, png []byte) {
	t.Helper()
	if len(png) == 0 {
		t.Errorf("empty screenshot %s", name)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Error(errors.Join(fmt.Errorf("saving %s", name), err))
	}
}
