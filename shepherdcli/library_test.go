package shepherdcli

import (
	"bytes"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/providers"
)

// testDefinition is a minimal process definition.
func testDefinition(label, name string) controlloop.Definition {
	return controlloop.Definition{
		Info: controlloop.Info{
			Process:        bmdb.Process{Name: name},
			Label:          label,
			DefaultBackoff: bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 2},
		},
		Candidates: func() (bmdb.Candidates, error) { return agentstart.Candidates(), nil },
		New:        func(env controlloop.Env) (controlloop.Handler, error) { return agentstart.New(env.Provider), nil },
	}
}

// Mistakes in a binary's registrations are reported by Main, with status
// 1 and one line, before anything runs.
func TestBadDefinitions(t *testing.T) {
	t.Parallel()
	noNew := testDefinition("nonew", "NoNew")
	noNew.New = nil
	noCandidates := testDefinition("nocand", "NoCand")
	noCandidates.Candidates = nil
	for _, c := range []struct {
		name      string
		processes []controlloop.Definition
		providers []providers.Definition
		want      string
	}{
		{"none", nil, nil, "shepherd: no process registered"},
		{"bad label", []controlloop.Definition{testDefinition("Fw-Check", "FwCheck")}, nil, `invalid label "Fw-Check"`},
		{"bad name", []controlloop.Definition{testDefinition("fw", "fw check")}, nil, `process fw: invalid process name "fw check"`},
		{"no New", []controlloop.Definition{noNew}, nil, "process nonew: no New function"},
		{"no Candidates", []controlloop.Definition{noCandidates}, nil, "process nocand: no Candidates function"},
		{"twice", []controlloop.Definition{testDefinition("fw", "Fw"), testDefinition("fw", "Fw")}, nil, "process fw (Fw) registered twice"},
		{"same name", []controlloop.Definition{testDefinition("fw", "Fw"), testDefinition("fw2", "Fw")}, nil, "registered twice"},
		{"provider like a built-in", []controlloop.Definition{testDefinition("fw", "Fw")}, []providers.Definition{{Name: "sim", New: func(providers.Env) (providers.Provider, error) { return nil, nil }}}, "provider sim registered twice (or named like a built-in one)"},
		{"provider without New", []controlloop.Definition{testDefinition("fw", "Fw")}, []providers.Definition{{Name: "mine"}}, "provider mine: no New function"},
	} {
		d := New()
		for _, p := range c.processes {
			d.AddProcess(p)
		}
		for _, p := range c.providers {
			d.AddProvider(p)
		}
		var stdout, stderr bytes.Buffer
		code := d.Main([]string{"-h"}, &stdout, &stderr)
		if code != exitFailure || !strings.Contains(stderr.String(), c.want) || strings.Count(stderr.String(), "\n") != 1 || stdout.Len() != 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want 1 and one line containing %q", c.name, code, stdout.String(), stderr.String(), c.want)
		}
	}
}

// A registered process and provider are part of the command line: the
// process's flags and its check, -processes (a disabled process only
// when named), and -provider with the provider's flags.
func TestRegisteredFlags(t *testing.T) {
	t.Parallel()
	var period time.Duration
	fw := testDefinition("fw", "Fw")
	fw.Flags = func(fs *flag.FlagSet) { fs.DurationVar(&period, "fw_period", time.Hour, "period") }
	fw.Check = func() error {
		if period <= 0 {
			return usagef("-fw_period %s: must be positive", period)
		}
		return nil
	}
	off := testDefinition("off", "Off")
	off.Disabled = true
	var rate float64
	d := New()
	d.AddProcess(fw)
	d.AddProcess(off)
	d.AddProvider(providers.Definition{
		Name: "mine", Usage: "my machines",
		Flags: func(fs *flag.FlagSet) { fs.Float64Var(&rate, "mine_rate", 0, "rate") },
		New:   func(providers.Env) (providers.Provider, error) { return nil, nil },
	})
	parse := func(args ...string) (*daemonConfig, error) {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		cfg := newDaemonFlags(fs, d)
		if _, err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		cfg.noteGiven(fs)
		return cfg, cfg.check()
	}
	cfg, err := parse()
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if len(cfg.enabled) != 1 || cfg.enabled[0].def.Info.Label != "fw" {
		t.Errorf("enabled by default: %d processes, want fw alone", len(cfg.enabled))
	}
	if cfg, err := parse("-processes=fw,off", "-fw_period=2h", "-off_loop_parallelism=2"); err != nil || len(cfg.enabled) != 2 || period != 2*time.Hour {
		t.Errorf("-processes=fw,off -fw_period=2h: %v, period %s", err, period)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-fw_period=0s"}, "-fw_period 0s: must be positive"},
		{[]string{"-processes=fw,nope"}, `unknown process "nope" (known: fw, off)`},
		{[]string{"-mine_rate=0.5"}, "-mine_rate: only with -provider mine (the provider is sim)"},
		{[]string{"-provider=theirs"}, `-provider "theirs": unknown provider (known: sim, static, mine)`},
	} {
		if _, err := parse(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	if cfg, err := parse("-provider=mine", "-mine_rate=0.5"); err != nil || cfg.provider != "mine" || rate != 0.5 {
		t.Errorf("-provider=mine -mine_rate=0.5: %v, rate %g", err, rate)
	}
}

// Demo mode applies each process's DemoFlags and shortens every process's
// backoff, unless the command line set them; a DemoFlags naming no flag is
// an error, not a panic.
func TestDemoDefaultsOfRegisteredProcesses(t *testing.T) {
	t.Parallel()
	var period time.Duration
	fw := testDefinition("fw", "Fw")
	fw.Flags = func(fs *flag.FlagSet) { fs.DurationVar(&period, "fw_period", time.Hour, "period") }
	fw.DemoFlags = map[string]string{"fw_period": "2m"}
	d := New()
	d.AddProcess(fw)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	newDaemonFlags(fs, d)
	if _, err := parseFlags(fs, []string{"-fw_backoff_maximum=1h"}); err != nil {
		t.Fatal(err)
	}
	applied, err := applyDemoDefaults(fs, d.processes, d.provider("sim"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(applied, " "); got != "-fw_period=2m -sim_heartbeat_loss_rate=0.5" {
		t.Errorf("applied %q, want the period and sim's loss rate (the backoff group was set)", got)
	}
	if period != 2*time.Minute {
		t.Errorf("-fw_period %s, want 2m", period)
	}

	fw.DemoFlags = map[string]string{"fw_perod": "2m"}
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	newDaemonFlags(fs, d)
	if _, err := applyDemoDefaults(fs, []controlloop.Definition{fw}, nil); err == nil || !strings.Contains(err.Error(), "demo default -fw_perod=2m") {
		t.Errorf("a DemoFlags naming no flag: %v", err)
	}
}

// A registered provider's DemoFlags are demo defaults when it is the one
// selected, and only then; a DemoFlags naming no flag is an error.
func TestDemoDefaultsOfRegisteredProvider(t *testing.T) {
	t.Parallel()
	var machines int
	mine := providers.Definition{
		Name:      "mine",
		Demo:      true,
		Flags:     func(fs *flag.FlagSet) { fs.IntVar(&machines, "mine_machines", 1, "machines") },
		New:       func(providers.Env) (providers.Provider, error) { return nil, nil },
		DemoFlags: map[string]string{"mine_machines": "20"},
	}
	d := New()
	d.AddProcess(testDefinition("fw", "Fw"))
	d.AddProvider(mine)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	newDaemonFlags(fs, d)
	if _, err := parseFlags(fs, []string{"-fw_backoff_maximum=1h"}); err != nil {
		t.Fatal(err)
	}
	applied, err := applyDemoDefaults(fs, d.processes, d.provider("mine"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(applied, " "); got != "-mine_machines=20" {
		t.Errorf("applied %q, want the provider's machines alone (sim's are sim's)", got)
	}
	if machines != 20 {
		t.Errorf("-mine_machines %d, want 20", machines)
	}
	// sim and static are registered as mine is.
	if d.provider("sim") == nil || d.provider("static") == nil || d.provider("nope") != nil {
		t.Error("sim and static are not registered, or an unknown provider is")
	}

	// Set on the command line: kept.
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	newDaemonFlags(fs, d)
	if _, err := parseFlags(fs, []string{"-mine_machines=3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := applyDemoDefaults(fs, d.processes, d.provider("mine")); err != nil || machines != 3 {
		t.Errorf("-mine_machines given as 3: %d, %v", machines, err)
	}

	mine.DemoFlags = map[string]string{"mine_machnes": "20"}
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	newDaemonFlags(fs, d)
	if _, err := applyDemoDefaults(fs, d.processes, &mine); err == nil || !strings.Contains(err.Error(), "demo default -mine_machnes=20") {
		t.Errorf("a provider's DemoFlags naming no flag: %v", err)
	}
}

// migrate -extension names an extension of the binary; shepherd has none.
func TestMigrateUnknownExtension(t *testing.T) {
	t.Parallel()
	const dsn = "postgres://shepherd@127.0.0.1:1/nowhere"
	code, stdout, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), "migrate", "force", "1", "-extension", "firmwarecheck", "-bmdb_dsn", dsn)
	want := `shepherd: -extension "firmwarecheck": this binary has no such extension (it has: none)` + "\n"
	if code != exitUsage || stdout != "" || stderr != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want %d and %q", code, stdout, stderr, exitUsage, want)
	}
}
