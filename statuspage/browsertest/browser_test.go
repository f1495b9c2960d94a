package browsertest_test

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/statuspage"
	"github.com/shepherd-fleet/shepherd/statuspage/statuspagetest"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

// The two shipped processes, as their packages declare them (the same list
// as the status page's own tests).
var processes = []statuspage.Process{
	{Info: controlloop.Info{Process: agentstart.Process, Label: "agentstart"}, Candidates: agentstart.Candidates()},
	{Info: controlloop.Info{Process: recovery.Process, Label: "recovery"}, Candidates: recovery.Candidates(30*time.Minute, 10*time.Minute)},
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
	f := statuspagetest.NewFleet(t)
	srv := httptest.NewServer(statuspage.New(f.DB, processes, statuspage.Options{}))
	defer srv.Close()
	// The same pages, refreshing every second, for the refresh check.
	liveSrv := httptest.NewServer(statuspage.New(f.DB, processes, statuspage.Options{Refresh: time.Second}))
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
	if failureCause != statuspagetest.HostileCause {
		t.Errorf("the failure cause reads %q, want the literal text %q", failureCause, statuspagetest.HostileCause)
	}
	totals := run(t, ctx, "reading the totals", chromedp.Text(chromedp.CSS("#totals")))
	for _, want := range []string{"8\nmachines", "0\nagents healthy", "1\nagents stale", "7\nnever started"} {
		if !strings.Contains(totals, want) {
			t.Errorf("the fleet totals do not read %q: %q", want, totals)
		}
	}
	recovered := run(t, ctx, "reading the recovered failure", chromedp.Text(chromedp.CSS("#process-agentstart tr.recovered")))
	if !strings.Contains(recovered, "recovered") || !strings.Contains(recovered, statuspagetest.RecoveredCause) {
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
	if want := srv.URL + statuspage.MachinePath(f.Failed); location != want {
		t.Errorf("the failure link led to %s, want %s", location, want)
	}
	for _, want := range []string{f.Failed.String(), "Tags", "dc1/rack1", "192.0.2.", "Failed", statuspagetest.HostileCause,
		"Retried", "BMC reset by hand", "Started", "ShepherdAgentStart", "shepherd backoff clear"} {
		if !strings.Contains(machineText, want) {
			t.Errorf("the machine page does not show %q", want)
		}
	}

	// The lookup form of the overview leads to the same page.
	do(t, ctx, "looking a machine up",
		chromedp.Navigate(srv.URL+"/status"),
		chromedp.SendKeys(chromedp.CSS("form.lookup input"), f.Leased.String()),
		chromedp.Submit(chromedp.CSS("form.lookup")),
		chromedp.WaitVisible(chromedp.CSS("table.history")))
	if loc := run(t, ctx, "reading the location", chromedp.Location()); loc != srv.URL+statuspage.MachinePath(f.Leased) {
		t.Errorf("the lookup form led to %s", loc)
	}

	// The search takes provider ids too: one match opens the machine, an
	// id that two providers use lists both, an unknown one says so.
	names, err := operator.New(f.DB).ProviderIDs(context.Background(), []uuid.UUID{f.Failed})
	if err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "searching a provider id",
		chromedp.Navigate(srv.URL+"/status"),
		chromedp.SetValue(chromedp.CSS("form.lookup input"), names[f.Failed]),
		chromedp.Submit(chromedp.CSS("form.lookup")),
		chromedp.WaitVisible(chromedp.CSS("table.history")))
	if loc := run(t, ctx, "reading the location", chromedp.Location()); loc != srv.URL+statuspage.MachinePath(f.Failed) {
		t.Errorf("searching %s led to %s, want its machine's page", names[f.Failed], loc)
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
		chromedp.Navigate(srv.URL+statuspage.MachinePath(f.Failed)),
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
	if _, err := operator.New(f.DB).ResumeProcess(context.Background(), recovery.Process.Name); err != nil {
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
