package daemon_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// gatedProvider is a program's own provider: the simulated fleet, whose
// preparation waits for the test and whose reloads the test sees.
type gatedProvider struct {
	*sim.Provider
	release  chan struct{}
	reloaded chan struct{}
}

func (p *gatedProvider) Prepare(ctx context.Context) error {
	select {
	case <-p.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.Seed(ctx)
}

func (p *gatedProvider) Reload(context.Context) error {
	p.reloaded <- struct{}{}
	return nil
}

// A provider is run through its definition alone, as sim and static are:
// New gets the URL of the heartbeat endpoint the daemon serves (with the
// port it bound) and a logger; /readyz says what Prepare does
// (Definition.Preparing) until it succeeds; Reload reaches the provider's
// Reload.
func TestProviderDefinitionLifecycle(t *testing.T) {
	t.Parallel()
	gp := &gatedProvider{release: make(chan struct{}), reloaded: make(chan struct{}, 1)}
	envs := make(chan providers.Env, 1)
	def := providers.Definition{
		Name:      "gated",
		Preparing: "waiting for the test",
		New: func(env providers.Env) (providers.Provider, error) {
			envs <- env
			cfg := sim.DefaultConfig()
			cfg.Machines = 2
			gp.Provider = sim.New(env.DB, cfg)
			return gp, nil
		},
	}
	td := newTestDaemonWith(t, func(o *daemon.Options) {
		o.Provider = def
		o.Agents.Listen = "127.0.0.1:0"
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := td.Add(td.waitReady(func(ctx context.Context) error {
		td.Reload()
		select {
		case <-gp.reloaded:
		case <-ctx.Done():
			return nil
		}
		cancel()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	done := runDaemon(ctx, td)
	url := <-td.url
	td.url <- url
	bmdbtest.WaitFor(t, 2*time.Minute, "/readyz to say what the provider prepares", func() (bool, string) {
		code, body, err := readyz(ctx, url)
		return err == nil && code == http.StatusInternalServerError && strings.Contains(body, "[-]running failed: waiting for the test"), body
	})
	close(gp.release)
	if err := waitRun(t, done); err != nil {
		t.Fatalf("Run: %v", err)
	}
	env := <-envs
	if m := regexp.MustCompile(`^http://127\.0\.0\.1:(\d+)/agent/v1/heartbeat$`).FindStringSubmatch(env.HeartbeatURL); m == nil || m[1] == "0" {
		t.Errorf("Env.HeartbeatURL %q, want the endpoint's with its bound port", env.HeartbeatURL)
	}
	if env.DB == nil || env.Registerer == nil || env.Logger.GetSink() == nil {
		t.Errorf("Env %+v: want a database, a registerer and a logger", env)
	}
}

// New refuses a provider it cannot build, and demo mode (no DSN) with a
// provider that is not a simulation: its machines would be real.
func TestNewChecksTheProvider(t *testing.T) {
	t.Parallel()
	def := agentstart.Definition()
	loops := []daemon.Loop{{Definition: def, Config: controlloop.DefaultConfig(def.Info)}}
	newProvider := func(providers.Env) (providers.Provider, error) { return nil, nil }
	for _, c := range []struct {
		name string
		opts daemon.Options
		want string
	}{
		{"no New", daemon.Options{DSN: "postgres://h/db", Loops: loops, Provider: providers.Definition{Name: "mine"}}, `provider "mine": want a Name and a New function`},
		{"demo, real machines", daemon.Options{Loops: loops, Provider: providers.Definition{Name: "mine", New: newProvider}}, "provider mine: no DSN given, and demo mode runs only with a provider made for it"},
	} {
		if _, err := daemon.New(c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// Zero: the simulated fleet, which demo mode may run.
	if _, err := daemon.New(daemon.Options{Loops: loops}); err != nil {
		t.Errorf("no provider, no DSN: %v", err)
	}
}
