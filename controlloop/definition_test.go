package controlloop_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/processes/agentstart"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// testDefinition is a valid definition whose handler finishes every
// machine once (commitAgent).
func testDefinition() controlloop.Definition {
	return controlloop.Definition{
		Info: controlloop.Info{
			Process:        bmdb.Process{Name: "TestDefinition"},
			Label:          "testdef",
			DefaultBackoff: bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 2},
		},
		Candidates: func() (bmdb.Candidates, error) { return agentstart.Candidates(), nil },
		New: func(controlloop.Env) (controlloop.Handler, error) {
			return controlloop.HandlerFunc(func(_ context.Context, t *controlloop.Task) error {
				commitAgent(t)
				return nil
			}), nil
		},
	}
}

// A runner of a Definition runs the handler its New built, over the
// definition's candidates, under the definition's identity.
func TestRunnerOfDefinition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(5)
	def := testDefinition()
	if err := def.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	h, err := def.New(controlloop.Env{DB: e.db.Public()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	cfg := controlloop.DefaultConfig(def.Info)
	cfg.QueryRate = controlloop.Rate{Interval: 0, Burst: 1}
	cfg.IdlePoll = 50 * time.Millisecond
	r, err := controlloop.NewRunner(e.db.Public(), def, h, cfg, controlloop.NewMetrics(e.reg))
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	if got := r.Info(); got != def.Info {
		t.Errorf("Info: %+v, want the definition's %+v", got, def.Info)
	}
	stop := bmdbtest.Background(t, "Run", r.Run)
	bmdbtest.WaitForNoError(t, 30*time.Second, "every machine to be finished", func() (bool, error) {
		return e.count(bmdb.EventFinished) == len(machines), nil
	})
	stop()
	h2 := e.history()
	checkFinishedOnce(t, h2, machines)
	for _, ev := range h2 {
		if ev.Process != def.Info.Process.Name {
			t.Errorf("history event of process %q, want %q", ev.Process, def.Info.Process.Name)
		}
	}
}

// A definition's mistakes are its author's: reported by Validate and
// NewRunner, each naming what is wrong, before anything runs.
func TestDefinitionValidate(t *testing.T) {
	t.Parallel()
	noop := controlloop.HandlerFunc(func(context.Context, *controlloop.Task) error { return nil })
	for _, tc := range []struct {
		name   string
		change func(*controlloop.Definition)
		want   string
	}{
		{"bad label", func(d *controlloop.Definition) { d.Info.Label = "Test-Def" }, `invalid label "Test-Def"`},
		{"empty label", func(d *controlloop.Definition) { d.Info.Label = "" }, `invalid label ""`},
		{"bad name", func(d *controlloop.Definition) { d.Info.Process.Name = "not a name" }, "process testdef:"},
		{"no New", func(d *controlloop.Definition) { d.New = nil }, "process testdef: no New function"},
		{"no Candidates", func(d *controlloop.Definition) { d.Candidates = nil }, "process testdef: no Candidates function"},
	} {
		def := testDefinition()
		tc.change(&def)
		err := def.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	def := testDefinition()
	m := controlloop.NewMetrics(prometheus.NewRegistry())
	if _, err := controlloop.NewRunner(nil, def, nil, controlloop.DefaultConfig(def.Info), m); err == nil || !strings.Contains(err.Error(), "nil handler") {
		t.Errorf("NewRunner with a nil handler: %v, want an error saying so", err)
	}
	def.Candidates = func() (bmdb.Candidates, error) {
		return bmdb.NewCandidates(bmdb.Condition{Name: "unbalanced", SQL: "(true"})
	}
	if _, err := controlloop.NewRunner(nil, def, noop, controlloop.DefaultConfig(def.Info), m); err == nil || !strings.Contains(err.Error(), "candidates: ") {
		t.Errorf("NewRunner with a condition NewCandidates refuses: %v, want a candidates error", err)
	}
	def.Candidates = nil
	if _, err := controlloop.NewRunner(nil, def, noop, controlloop.DefaultConfig(def.Info), m); err == nil || !strings.Contains(err.Error(), "no Candidates") {
		t.Errorf("NewRunner without Candidates: %v, want an error saying so", err)
	}
}

// firmwareReader is an interface of a provider that a process needs
// beyond providers.Provider.
type firmwareReader interface {
	CheckFirmware(ctx context.Context, m bmdb.Provided) (string, error)
}

// ProviderAs gives a process its own interface of the provider, or an
// error naming the provider and the interface; with no provider at all
// (which no running process has) it is an error too, never a nil T.
func TestProviderAs(t *testing.T) {
	t.Parallel()
	p := sim.New(nil, sim.DefaultConfig())
	if got, err := controlloop.ProviderAs[providers.Provider](controlloop.Env{Provider: p}); err != nil || got != p {
		t.Errorf("ProviderAs[providers.Provider]: %v, %v; want the provider", got, err)
	}
	_, err := controlloop.ProviderAs[firmwareReader](controlloop.Env{Provider: p})
	if err == nil || !strings.Contains(err.Error(), "provider sim does not implement controlloop_test.firmwareReader") {
		t.Errorf("ProviderAs of an interface sim lacks: %v, want an error naming both", err)
	}
	if _, err := controlloop.ProviderAs[firmwareReader](controlloop.Env{}); err == nil {
		t.Error("ProviderAs without a provider: no error")
	}
}
