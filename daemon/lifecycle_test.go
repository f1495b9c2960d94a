package daemon_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// testDaemon is a daemon running AgentStart over a small simulated fleet
// in a database of its own, which logs through the test.
type testDaemon struct {
	*daemon.Daemon
	// url is the HTTP server's, once it logged it.
	url chan string

	mu    sync.Mutex
	lines []string // the log
}

// log returns the lines logged so far.
func (td *testDaemon) log() string {
	td.mu.Lock()
	defer td.mu.Unlock()
	return strings.Join(td.lines, "\n")
}

var urlRE = regexp.MustCompile(`"msg"="Serving /metrics, /healthz and /readyz" "url"="(http://[^"]+)"`)

func newTestDaemon(t *testing.T) *testDaemon {
	t.Helper()
	return newTestDaemonWith(t, nil)
}

// newTestDaemonWith is newTestDaemon with its options changed by edit
// (nil: none).
func newTestDaemonWith(t *testing.T, edit func(*daemon.Options)) *testDaemon {
	t.Helper()
	td := &testDaemon{url: make(chan string, 1)}
	var once sync.Once
	// A line logged after the test ended (none should be: Run waits for
	// every part) must not panic in t.Log.
	var mu sync.Mutex
	ended := false
	t.Cleanup(func() {
		mu.Lock()
		ended = true
		mu.Unlock()
	})
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		if !ended {
			t.Log(prefix, args)
		}
		mu.Unlock()
		td.mu.Lock()
		td.lines = append(td.lines, args)
		td.mu.Unlock()
		if m := urlRE.FindStringSubmatch(args); m != nil {
			once.Do(func() { td.url <- m[1] })
		}
	}, funcr.Options{})
	def := agentstart.Definition()
	// The simulated provider as a command line configures it: its
	// definition, with its flags parsed.
	simDef := sim.Definition()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	simDef.Flags(fs)
	if err := fs.Parse([]string{"-sim_machines=3"}); err != nil {
		t.Fatal(err)
	}
	opts := daemon.Options{
		Logger:           log,
		DSN:              bmdbtest.NewDatabase(t),
		Loops:            []daemon.Loop{{Definition: def, Config: controlloop.DefaultConfig(def.Info)}},
		Provider:         simDef,
		Listen:           "127.0.0.1:0",
		HistoryRetention: time.Hour,
	}
	if edit != nil {
		edit(&opts)
	}
	d, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	td.Daemon = d
	return td
}

// readyz returns the status and body of /readyz at the server's url, or
// of the page at url if it names a path.
func readyz(ctx context.Context, url string) (int, string, error) {
	if !strings.Contains(strings.TrimPrefix(url, "http://"), "/") {
		url += "/readyz"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitReady is a part that waits until the daemon is ready (its loops run
// with live sessions), then calls then.
func (td *testDaemon) waitReady(then func(ctx context.Context) error) daemon.Runnable {
	return daemon.RunnableFunc(func(ctx context.Context) error {
		var url string
		select {
		case url = <-td.url:
			td.url <- url
		case <-ctx.Done():
			return errors.New("stopped before the HTTP server was logged")
		}
		for {
			if code, _, err := readyz(ctx, url); err == nil && code == http.StatusOK {
				return then(ctx)
			}
			select {
			case <-ctx.Done():
				return errors.New("stopped before the daemon was ready")
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// stopWitness is a part that, once stopped, records what /readyz said:
// the loops' stage stops before the HTTP server, which must still answer
// and report the stop.
type stopWitness struct {
	td      *testDaemon
	stopped chan string
}

func (w *stopWitness) Start(ctx context.Context) error {
	<-ctx.Done()
	url := <-w.td.url
	code, body, err := readyz(context.Background(), url)
	w.stopped <- fmt.Sprintf("%d %s %v", code, strings.TrimSpace(body), err)
	return nil
}

// runDaemon runs td in the background and returns Run's result channel.
func runDaemon(ctx context.Context, td *testDaemon) chan error {
	done := make(chan error, 1)
	go func() { done <- td.Run(ctx) }()
	return done
}

// waitRun waits for Run's result, failing the test if the daemon hangs.
func waitRun(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(3 * time.Minute):
		t.Fatal("Run did not return: a part was left running")
		return nil
	}
}

// The first part's error stops every part, in order (the loops' stage
// before the HTTP server, which reports the stop on /readyz), and Run
// returns that error.
func TestRunReturnsFirstError(t *testing.T) {
	t.Parallel()
	td := newTestDaemon(t)
	boom := errors.New("boom")
	if err := td.Add(td.waitReady(func(context.Context) error { return boom })); err != nil {
		t.Fatal(err)
	}
	w := &stopWitness{td: td, stopped: make(chan string, 1)}
	if err := td.Add(w); err != nil {
		t.Fatal(err)
	}
	err := waitRun(t, runDaemon(context.Background(), td))
	if !errors.Is(err, boom) {
		t.Fatalf("Run: %v, want the first part's error, boom", err)
	}
	select {
	case got := <-w.stopped:
		if !strings.HasPrefix(got, "500 [-]running failed: stopping: boom\n") {
			t.Errorf("/readyz while the loops stopped: %q, want 500 and running failed: stopping: boom", got)
		}
	default:
		t.Error("Run returned before stopping a part")
	}
	if err := td.Add(w); err == nil {
		t.Error("Add after Run succeeded")
	}
	if err := td.Run(context.Background()); err == nil {
		t.Error("a second Run succeeded")
	}
}

// The end of Run's context stops every part, and Run returns nil.
func TestRunStopsWithContext(t *testing.T) {
	t.Parallel()
	td := newTestDaemon(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := td.Add(td.waitReady(func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	checked := make(chan struct{})
	if err := td.AddReadyzCheck("test", func(*http.Request) error {
		select {
		case <-checked:
		default:
			close(checked)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	w := &stopWitness{td: td, stopped: make(chan string, 1)}
	if err := td.Add(w); err != nil {
		t.Fatal(err)
	}
	if err := waitRun(t, runDaemon(ctx, td)); err != nil {
		t.Fatalf("Run: %v, want nil after the context ended", err)
	}
	select {
	case <-checked:
	default:
		t.Error("the readiness check was never called")
	}
	select {
	case got := <-w.stopped:
		if !strings.HasPrefix(got, "500 [-]running failed: shutting down\n") {
			t.Errorf("/readyz while the loops stopped: %q, want 500 and running failed: shutting down", got)
		}
	default:
		t.Error("Run returned before stopping a part")
	}
}

// A readiness check of the program's own makes /readyz fail, naming it
// beside the built-in checks, as controller-runtime's healthz does:
// ?verbose lists every check, ?exclude leaves one out, /readyz/NAME
// answers for one.
func TestAddReadyzCheck(t *testing.T) {
	t.Parallel()
	td := newTestDaemon(t)
	// The reason is the check's error on one line (a newline escaped).
	if err := td.AddReadyzCheck("mine", func(*http.Request) error { return errors.New("not\nyet") }); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"mine", "database", "Mine", "", "a b"} {
		if err := td.AddReadyzCheck(bad, func(*http.Request) error { return nil }); err == nil {
			t.Errorf("AddReadyzCheck(%q) succeeded", bad)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runDaemon(ctx, td)
	url := <-td.url
	td.url <- url
	want := "[+]running ok\n[+]database ok\n[+]sessions ok\n[+]stalled ok\n[-]mine failed: not\\nyet\nreadyz check failed\n"
	bmdbtest.WaitFor(t, 2*time.Minute, "/readyz to name every check", func() (bool, string) {
		code, body, err := readyz(ctx, url+"/readyz?verbose")
		return code == http.StatusInternalServerError && body == want, fmt.Sprintf("%d %q %v", code, body, err)
	})
	for _, c := range []struct {
		path string
		code int
		body string
	}{
		{"/readyz?exclude=mine", 200, "ok"},
		{"/readyz?verbose&exclude=mine&exclude=stalled&exclude=nope", 200,
			"[+]running ok\n[+]database ok\n[+]sessions ok\nwarn: some readyz checks cannot be excluded: no matches for nope\nreadyz check passed\n"},
		{"/readyz/database", 200, "ok"},
		{"/readyz/mine", 500, "[-]mine failed: not\\nyet\n"},
	} {
		if code, body, err := readyz(ctx, url+c.path); code != c.code || body != c.body {
			t.Errorf("%s: %d %q %v, want %d %q", c.path, code, body, err, c.code, c.body)
		}
	}
	if code, _, err := readyz(ctx, url+"/readyz/nope"); code != http.StatusNotFound {
		t.Errorf("/readyz/nope: %d %v, want 404", code, err)
	}
	cancel()
	if err := waitRun(t, done); err != nil {
		t.Fatal(err)
	}
}

// stubborn is a part that ignores its context: it returns only once the
// test releases it.
type stubborn struct{ release chan struct{} }

func (s stubborn) Name() string { return "stubborn" }

func (s stubborn) Start(context.Context) error {
	<-s.release
	return nil
}

// A part that ignores its context does not hold the stop beyond
// GracefulShutdownTimeout: Run returns while the part still runs, with an
// error that wraps ErrShutdownTimeout and names the part, which the log
// names too. The stages after the loops' still get their stop.
func TestShutdownTimeoutNamesThePart(t *testing.T) {
	t.Parallel()
	const timeout = 3 * time.Second
	td := newTestDaemonWith(t, func(o *daemon.Options) {
		o.Loops[0].Config.ShutdownGrace = 100 * time.Millisecond
		o.GracefulShutdownTimeout = timeout
	})
	part := stubborn{release: make(chan struct{})}
	t.Cleanup(func() { close(part.release) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := td.Add(part); err != nil {
		t.Fatal(err)
	}
	if err := td.Add(td.waitReady(func(context.Context) error {
		cancel()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	err := waitRun(t, runDaemon(ctx, td))
	t.Logf("Run returned %s after the stop began", time.Since(started).Round(time.Millisecond))
	if !errors.Is(err, daemon.ErrShutdownTimeout) || !strings.Contains(err.Error(), "still running: stubborn") {
		t.Fatalf("Run: %v, want ErrShutdownTimeout naming stubborn", err)
	}
	log := td.log()
	if !regexp.MustCompile(`"msg"="The stop overran the shutdown timeout[^"]*".*"overran"=\["stubborn"\]`).MatchString(log) {
		t.Errorf("the log does not name the part that overran:\n%s", log)
	}
}

// New refuses a bound on the stop that a loop's grace for its in-flight
// work would overrun by itself.
func TestShutdownTimeoutBelowTheGrace(t *testing.T) {
	t.Parallel()
	def := agentstart.Definition()
	cfg := controlloop.DefaultConfig(def.Info)
	_, err := daemon.New(daemon.Options{
		Loops:                   []daemon.Loop{{Definition: def, Config: cfg}},
		GracefulShutdownTimeout: cfg.ShutdownGrace,
	})
	if err == nil || !strings.Contains(err.Error(), "must be longer than the ShutdownGrace of agentstart") {
		t.Errorf("New: %v, want an error naming the grace", err)
	}
	// Not given, the bound makes room for a longer grace.
	cfg.ShutdownGrace = time.Minute
	if _, err := daemon.New(daemon.Options{Loops: []daemon.Loop{{Definition: def, Config: cfg}}}); err != nil {
		t.Errorf("New with a 1m grace and the default bound: %v", err)
	}
}
