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
		Loops:            []daemon.Loop{{Process: def, Config: controlloop.DefaultConfig(def.Info)}},
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

// readyz returns /readyz's status and body.
func readyz(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
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
		if !strings.HasPrefix(got, "503 not ready:\nstopping: boom") {
			t.Errorf("/readyz while the loops stopped: %q, want 503 and stopping: boom", got)
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
		if !strings.HasPrefix(got, "503 not ready:\nshutting down") {
			t.Errorf("/readyz while the loops stopped: %q, want 503 and shutting down", got)
		}
	default:
		t.Error("Run returned before stopping a part")
	}
}

// A readiness check of the program's own makes /readyz fail, naming it.
func TestAddReadyzCheck(t *testing.T) {
	t.Parallel()
	td := newTestDaemon(t)
	if err := td.AddReadyzCheck("mine", func(*http.Request) error { return errors.New("not yet") }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runDaemon(ctx, td)
	url := <-td.url
	td.url <- url
	bmdbtest.WaitFor(t, 2*time.Minute, "/readyz to name the check", func() (bool, string) {
		code, body, err := readyz(ctx, url)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "\nmine: not yet"), fmt.Sprintf("%d %q %v", code, body, err)
	})
	cancel()
	if err := waitRun(t, done); err != nil {
		t.Fatal(err)
	}
}
